"""Test setup: import kvtier from this source tree unless told to use the
installed package (KVTIER_TEST_INSTALLED=1, e.g. after `pip install ./python`)."""

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


@pytest.fixture
def redis_url(tmp_path):
    """A redis-server of the test's own on a free loopback port, without
    persistence, killed afterwards; skips the test if none is installed."""
    if shutil.which("redis-server") is None:
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
