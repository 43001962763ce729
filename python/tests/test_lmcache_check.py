"""LMCache 0.5.6's own L2 adapter check (``python -m lmcache.v1.basic_check
--mode test_l2_adapter``) with kvtier's adapter, loaded through LMCache's
plugin type, on the memory, disk and Redis backends and ``persist_path``
(extents: the check's objects lie back to back, half a block each, where
block_bytes is larger), and on sealed tiers (whole rows: objects of exactly
block_bytes).

The check exits 0 even when a phase fails, so its validation lines are read:
every one must report all of its keys."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

pytest.importorskip("lmcache", reason="needs LMCache 0.5.6 (scripts/engine_env.sh installs it)")

from child import child_env  # noqa: E402

NUM_KEYS = 5
# What LMCache's check prints when a phase passes for every key.
PASSED = [
    f"Validation: {NUM_KEYS}/{NUM_KEYS} correctly absent",
    "Batch store OK",
    f"Validation: {NUM_KEYS}/{NUM_KEYS} found",
    f"Validation (loaded): {NUM_KEYS}/{NUM_KEYS}",
    f"Validation (content): {NUM_KEYS}/{NUM_KEYS}",
]
VALIDATION = re.compile(r"^\s*(Validation.*|Batch store \w+)", re.MULTILINE)


def run_check(params: dict, obj_size: int) -> str:
    spec = {"type": "plugin", "module_path": "kvtier.lmcache", "class_name": "KVTierL2Adapter",
            "adapter_params": params}
    proc = subprocess.run(
        [sys.executable, "-m", "lmcache.v1.basic_check", "--mode", "test_l2_adapter",
         "--l2-adapter", json.dumps(spec), "--num-keys", str(NUM_KEYS), "--obj-size", str(obj_size)],
        env=child_env(), capture_output=True, text=True, timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    return out


def assert_passed(out: str) -> None:
    assert "=== Testing L2 adapter #0 (KVTierL2Adapter) ===" in out, out
    assert "Test Failed" not in out, out
    assert [line.strip() for line in VALIDATION.findall(out)] == PASSED, out


# LMCache's default object (1024 bf16 elements, 2 KiB) and a 64 KiB one.
@pytest.mark.parametrize("obj_size", [1024, 32768])
def test_check_memory(obj_size):
    assert_passed(run_check({"block_bytes": obj_size * 2, "backend": "memory"}, obj_size))


@pytest.mark.parametrize("obj_size", [1024, 32768])
def test_check_disk(tmp_path, obj_size):
    params = {"block_bytes": obj_size * 2, "backend": "disk", "path": str(tmp_path / "kv")}
    assert_passed(run_check(params, obj_size))


# Objects of half a block, back to back: every other one off a row boundary.
@pytest.mark.parametrize("obj_size", [1024, 32768])
def test_check_redis(redis_url, obj_size):
    params = {"block_bytes": obj_size * 4, "backend": "redis", "url": redis_url}
    assert_passed(run_check(params, obj_size))


def test_check_persist_path():
    obj_size = 1024
    parent = tempfile.mkdtemp(prefix="kvtier-lmcache-check-", dir="/dev/shm")
    try:
        params = {"block_bytes": obj_size * 4, "persist_path": os.path.join(parent, "arena")}
        assert_passed(run_check(params, obj_size))
    finally:
        shutil.rmtree(parent, ignore_errors=True)


# Sealed tiers store no extents: objects of exactly block_bytes, on rows.
def test_check_sealed_redis_on_rows(redis_url):
    params = {"block_bytes": 65536, "backend": "redis", "url": redis_url, "seal_key": "ab" * 32}
    assert_passed(run_check(params, 32768))


def test_check_reports_a_failure_it_sees(tmp_path):
    """The parse above would see a failing phase: objects over block_bytes
    fail the store, and the check still exits 0."""
    out = run_check({"block_bytes": 1024, "backend": "memory"}, 1024)
    assert "Batch store FAIL" in out, out
    with pytest.raises(AssertionError):
        assert_passed(out)
