"""Test setup: import kvtier from this source tree unless told to use the
installed package (KVTIER_TEST_INSTALLED=1, e.g. after `pip install ./python`).

Under CI (CI=true) nothing may skip: a skipped test, or module, is reported as
failed, with the reason it gave. Elsewhere a skip stays a skip (`-ra` lists
the reasons)."""

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
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


def _harness() -> str:
    """The Rust tests' redis-server launcher, as a command (redis-harness/):
    KVTIER_REDIS_HARNESS, which python/run_tests.sh sets (building it if
    missing)."""
    path = os.environ.get("KVTIER_REDIS_HARNESS", "")
    if not path or not os.access(path, os.X_OK):
        pytest.fail(f"KVTIER_REDIS_HARNESS={path!r} is not the kvtier-redis-harness command "
                    "(python/run_tests.sh builds it)")
    return path


@contextlib.contextmanager
def _launched(*args: str) -> Iterator[str]:
    """The URL of a server (or cluster) the harness keeps until its stdin
    closes, then kills."""
    _need_redis()
    harness = subprocess.Popen([_harness(), *args], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    assert harness.stdin is not None and harness.stdout is not None
    try:
        url = harness.stdout.readline().strip()
        assert url, f"kvtier-redis-harness {' '.join(args)} exited {harness.wait()} (its stderr above)"
        yield url
    finally:
        harness.stdin.close()
        harness.wait(timeout=60)


@pytest.fixture
def redis_url():
    """A redis-server of the test's own on a free loopback port, without
    persistence, killed afterwards; skips the test if none is installed (fails
    it under CI=true)."""
    with _launched() as url:
        yield url


@pytest.fixture
def redis_cluster_url():
    """A Redis Cluster of three masters (no replicas) on loopback; its URL
    is every node as a seed. Skips without redis-server (fails under
    CI=true)."""
    with _launched("--cluster", "3") as url:
        yield url
