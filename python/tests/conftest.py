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


@pytest.fixture
def redis_url(tmp_path):
    """A redis-server of the test's own on a free loopback port, without
    persistence, killed afterwards; skips the test if none is installed (fails
    it under CI=true)."""
    if shutil.which("redis-server") is None:
        if IN_CI:
            pytest.fail("needs redis-server, which CI installs (scripts/test.sh)")
        pytest.skip("needs redis-server")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}"
    finally:
        server.kill()
        server.wait()
