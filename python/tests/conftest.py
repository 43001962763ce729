"""Test setup: import kvtier from this source tree unless told to use the
installed package (KVTIER_TEST_INSTALLED=1, e.g. after `pip install ./python`).

Under CI (CI=true) nothing may skip: a skipped test, or module, is reported as
failed, with the reason it gave. Elsewhere a skip stays a skip (`-ra` lists
the reasons)."""

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

if os.environ.get("KVTIER_TEST_INSTALLED") != "1":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

IN_CI = os.environ.get("CI") == "true"


def _skip_reason(report):
    if isinstance(report.longrepr, tuple):
        return report.longrepr[2]
    return str(report.longrepr)


def _fail_if_skipped_in_ci(report):
    if IN_CI and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, where nothing may skip: {_skip_reason(report)}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_if_skipped_in_ci(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    # A module-level skip (pytest.importorskip, allow_module_level=True).
    outcome = yield
    _fail_if_skipped_in_ci(outcome.get_result())


def _need_redis() -> None:
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        if IN_CI:
            pytest.fail("needs redis-server and redis-cli, which CI installs (scripts/test.sh)")
        pytest.skip("needs redis-server and redis-cli")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_ping(port: int) -> None:
    deadline = time.monotonic() + 10
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return
        except OSError:
            pass
        assert time.monotonic() < deadline, f"redis-server on port {port} did not start"
        time.sleep(0.05)


def _start_redis(directory: Path, *extra: str) -> tuple[subprocess.Popen, int]:
    """A redis-server on a free loopback port, without persistence."""
    directory.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(directory), *extra],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_for_ping(port)
    except BaseException:
        server.kill()
        server.wait()
        raise
    return server, port


@pytest.fixture
def redis_url(tmp_path):
    """A redis-server of the test's own on a free loopback port, without
    persistence, killed afterwards; skips the test if none is installed (fails
    it under CI=true)."""
    _need_redis()
    server, port = _start_redis(tmp_path)
    try:
        yield f"redis://127.0.0.1:{port}"
    finally:
        server.kill()
        server.wait()


def _cluster_ok(port: int) -> bool:
    out = subprocess.run(["redis-cli", "-p", str(port), "CLUSTER", "INFO"],
                         capture_output=True, text=True, timeout=10).stdout
    return "cluster_state:ok" in out


@pytest.fixture
def redis_cluster_url(tmp_path):
    """A Redis Cluster of three masters (no replicas) on loopback, made by
    ``redis-cli --cluster create`` as tests/common/redis.rs makes one; its
    URL is every node as a seed. Skips without redis-server (fails under
    CI=true)."""
    _need_redis()
    servers: list[subprocess.Popen] = []
    try:
        ports = []
        for i in range(3):
            # The bus port is chosen too: the default (port + 10000) may be taken.
            server, port = _start_redis(
                tmp_path / f"node{i}", "--cluster-enabled", "yes", "--cluster-port", str(_free_port()),
                "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000")
            servers.append(server)
            ports.append(port)
        subprocess.run(
            ["redis-cli", "--cluster", "create", *(f"127.0.0.1:{p}" for p in ports),
             "--cluster-replicas", "0", "--cluster-yes"],
            check=True, capture_output=True, timeout=60,
        )
        deadline = time.monotonic() + 30
        while not all(_cluster_ok(p) for p in ports):
            assert time.monotonic() < deadline, "the Redis Cluster never reported cluster_state:ok"
            time.sleep(0.1)
        yield ",".join(f"redis://127.0.0.1:{p}" for p in ports)
    finally:
        for server in servers:
            server.kill()
            server.wait()
