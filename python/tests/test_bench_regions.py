"""The benches' sweep of vLLM primary regions left in /dev/shm by a bench
that died (python/bench/vllm_tiers.py): it removes a region only when the
process named in it is gone, and nothing else."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

try:
    import vllm_tiers
except Exception as exc:  # ImportError, or a vLLM that fails to import
    pytest.skip(f"vLLM 0.33 is not importable ({exc!r})", allow_module_level=True)


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_only_regions_of_dead_benches_are_removed(tmp_path: Path) -> None:
    dead, live = _dead_pid(), os.getpid()
    names = {
        "dead": f"vllm_offload_kvtier-bench-{dead}-0123456789ab.mmap",
        "live": f"vllm_offload_kvtier-bench-{live}-0123456789ab.mmap",
        # An engine's own region, and a bench region of the name before pids.
        "engine": "vllm_offload_my-engine-1.mmap",
        "old": "vllm_offload_kvtier-bench-0123456789ab.mmap",
        "other": f"kvtier-bench-{dead}-0123456789ab.mmap",
    }
    for name in names.values():
        (tmp_path / name).write_bytes(b"x")
    assert vllm_tiers.remove_dead_regions(str(tmp_path)) == [names["dead"]]
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted(v for k, v in names.items() if k != "dead")


def test_a_region_the_bench_builds_names_its_process() -> None:
    config = vllm_tiers.offloading_config([], 4, 4096)
    assert config.engine_id.startswith(f"kvtier-bench-{os.getpid()}-")
    name = f"vllm_offload_{config.engine_id}.mmap"
    assert vllm_tiers._REGION.fullmatch(name)
