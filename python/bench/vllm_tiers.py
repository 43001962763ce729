"""Secondary tiers built as vLLM 0.33 builds them, for the benches: a real
``OffloadingConfig``, ``TieringOffloadingSpec`` over it and its
``get_manager()``, which maps vLLM's own primary buffer (a
``SharedOffloadRegion``: a /dev/shm file, MAP_SHARED, pre-faulted with
MADV_POPULATE_WRITE) and makes each tier through ``SecondaryTierFactory``
over that buffer. Also NVIDIA's KVCR (vLLM's built-in ``kvcr`` tier) where
``kvcr`` imports (``scripts/kvcr_env.sh`` builds such a venv), and the idle
CPU of a tier."""

from __future__ import annotations

import importlib.util
import os
import re
import resource
import socket
import time
import uuid
from typing import Any

import numpy as np
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

# vLLM names its region after the engine id; the bench's ids carry the pid
# of the process that maps it, so a later bench can tell a leftover (the
# process was killed, or failed while vLLM built its tiers) from a live one.
SHM_DIR = "/dev/shm"
_REGION = re.compile(r"vllm_offload_kvtier-bench-(\d+)-[0-9a-f]+\.mmap")

# The G2 slots in front of KVCR's G3: the bench's blocks in flight (16 jobs
# of 16); fewer fail stores. The bench stores that many other blocks after
# a store pass, untimed, so that every block it loads comes from G3.
G3_FRONT_SLOTS = 256


def kvcr_importable() -> bool:
    return importlib.util.find_spec("kvcr") is not None


def offloading_config(tiers: list[dict[str, Any]], rows: int, row: int) -> OffloadingConfig:
    """What vLLM's offloading connector builds for the scheduler (rank 0,
    TP 1): `rows` chunks of `row` bytes, one block per chunk. The manager's
    background poll thread is off: the bench polls every tier itself."""
    return OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=16, layer_names=("layer.0",), group_id=0),),
        worker_kv_bytes_per_block=row,
        enable_kv_cache_events=False,
        extra_config={"cpu_bytes_to_use": rows * row, "secondary_tiers": tiers, "tier_poll_interval_s": 0},
        engine_id=f"kvtier-bench-{os.getpid()}-{uuid.uuid4().hex[:12]}",
        model=OffloadingModelConfig(name="bench/model", dtype="bfloat16", max_model_len=4096),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(
            rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1,
            data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
            is_parallelism_agnostic=False),
        replicated_layout=False,
    )


def remove_dead_regions(shm_dir: str = SHM_DIR) -> list[str]:
    """Removes the primary regions of earlier benches whose process is gone
    (a killed bench leaves its region in tmpfs, 4 GiB a contender, and a few
    of them run the machine out of memory). Returns what it removed."""
    removed = []
    for name in sorted(os.listdir(shm_dir)):
        match = _REGION.fullmatch(name)
        if match is None or _alive(int(match.group(1))):
            continue
        try:
            os.unlink(os.path.join(shm_dir, name))
            removed.append(name)
        except FileNotFoundError:  # another bench removed it first
            pass
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        pass
    return True


class VllmBuilt:
    """vLLM's manager over its own primary region, with `tier` (or no tier,
    for a buffer only) as its one secondary tier."""

    def __init__(self, tier: dict[str, Any] | None, rows: int, row: int):
        remove_dead_regions()
        spec = TieringOffloadingSpec(offloading_config([tier] if tier else [], rows, row))
        self.manager = spec.get_manager()
        self.tier = self.manager.secondary_tiers[0] if tier else None
        view = np.asarray(self.manager.primary_tier.get_kv_memoryview()).view(np.uint8)
        assert view.shape[0] >= rows and view.shape[1] >= row, view.shape
        self.buffer = view[:rows, :row]

    def close(self) -> None:
        self.buffer = None
        self.tier = None
        self.manager.shutdown()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kvcr_config(rows: int, row: int, g3_dir: str | None) -> dict[str, Any]:
    """KVCR as vLLM's `kvcr` tier: a local DRAM pool (G2) of `rows` blocks,
    or, given `g3_dir`, its file tier (G3) there with the POSIX backend (no
    GPU, no GDS). Its control channel listens on a free loopback port."""
    cfg: dict[str, Any] = {
        "type": "kvcr",
        "router_capabilities": ["router_hint"],
        "control_host": "127.0.0.1",
        "control_advertise_host": "127.0.0.1",
        "control_ports": [free_port()],
        # Its 1 s default fails jobs on a loaded 2-core machine ("source
        # progress stalled"); kvtier's disk has no deadline on a local disk.
        "operation_timeout_ms": 60_000,
        "abandon_timeout_ms": 120_000,
    }
    if g3_dir is None:
        cfg["secondary_g2_slots"] = rows
    else:
        # G3 needs a G2 in front (which must hold every block in flight, or
        # stores fail) and loads from it what it still holds: see
        # G3_FRONT_SLOTS.
        cfg["secondary_g2_slots"] = G3_FRONT_SLOTS
        cfg["g3"] = {"paths": [g3_dir], "capacity_bytes_per_file": rows * row, "backend": "POSIX"}
    return cfg


def with_directory(config: dict[str, Any], directory: str) -> dict[str, Any]:
    """`config` pointed at `directory`, for the tiers that keep files."""
    cfg = dict(config)
    if cfg["type"] == "fs":
        cfg["root_dir"] = directory
    elif cfg["type"] == "kvcr" and "g3" in cfg:
        # G3's paths are its files, preallocated to capacity_bytes_per_file.
        cfg["g3"] = {**cfg["g3"], "paths": [f"{directory}/g3.kvcr"]}
    elif cfg.get("backend") == "disk":
        cfg["path"] = directory
    return cfg


def process_cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


def idle_cpu(config: dict[str, Any], directory: str, seconds: float, rows: int = 64,
             row: int = 64 << 10) -> float:
    """Cores this process burns while a tier built from `config` sits idle
    for `seconds` (nothing submitted, nothing polled), measured after it is
    built and before it is shut down."""
    built = VllmBuilt(with_directory(config, directory), rows, row)
    try:
        time.sleep(0.5)  # past the tier's start-up work
        before, t0 = process_cpu_seconds(), time.perf_counter()
        time.sleep(seconds)
        return (process_cpu_seconds() - before) / (time.perf_counter() - t0)
    finally:
        built.close()
