"""A vLLM 0.33 engine's offloading side as vLLM builds it, on CPU: a real
``OffloadingConfig`` (the fields vLLM derives from its ``VllmConfig``), a
``TieringOffloadingSpec`` over it and its ``get_manager()``, so that kvtier is
made by vLLM's factory over vLLM's own primary buffer (``SharedOffloadRegion``),
and the scheduler's own block hashing for keys. Shared by the identity tests
and the fleet test's engine processes."""

from __future__ import annotations

import time
import uuid
from typing import Any

import numpy as np
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_offload.base import LookupResult, ReqContext, ScheduleEndContext, make_offload_key
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec
from vllm.v1.request import Request

HIT, MISS, RETRY = LookupResult.HIT, LookupResult.MISS, LookupResult.RETRY
TOKENS_PER_BLOCK = 16
LAYERS = ("model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn")
# One chunk of the engine's whole KV (every worker's share): the same row
# size at any TP size, so that only kvtier's namespace can tell them apart.
ROW = 64 * 1024
ROWS = 8


def offloading_config(tier: dict[str, Any], *, model: str = "org/model-a", dtype: str = "float16",
                      tp: int = 1, layers: tuple[str, ...] = LAYERS, agnostic: bool = False,
                      replicated: bool = False, rows: int = ROWS) -> OffloadingConfig:
    """What vLLM's offloading connector builds for the scheduler (rank 0)."""
    return OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=TOKENS_PER_BLOCK, layer_names=tuple(layers),
                                      group_id=0),),
        worker_kv_bytes_per_block=ROW // tp,
        enable_kv_cache_events=False,
        extra_config={"cpu_bytes_to_use": rows * ROW, "secondary_tiers": [dict(tier)]},
        engine_id=f"kvtier-test-{uuid.uuid4().hex[:12]}",
        model=OffloadingModelConfig(name=model, dtype=dtype, max_model_len=4096),
        cache=OffloadingCacheConfig(tokens_per_hash=TOKENS_PER_BLOCK, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(
            rank=0, world_size=tp, tp_size=tp, pp_size=1, pcp_size=1, dcp_size=1,
            data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
            is_parallelism_agnostic=agnostic),
        replicated_layout=replicated,
    )


def kvtier_entry(**config: Any) -> dict[str, Any]:
    return {"type": "KVTierSecondaryTier", "module_path": "kvtier.vllm", "capacity_bytes": "4MiB",
            "io_threads": 2, "probe_ttl_ms": 10, **config}


def block_keys(token_ids: list[int], hash_algo: str = "sha256") -> list[bytes]:
    """The offload keys vLLM's scheduler makes for a prompt: the engine
    core's block hasher (``init_none_hash`` then ``get_request_block_hasher``
    with ``prefix_caching_hash_algo``), one key per full block of group 0
    (one block per chunk)."""
    hash_fn = get_hash_fn_by_name(hash_algo)
    init_none_hash(hash_fn)
    request = Request(request_id=f"r-{uuid.uuid4().hex[:8]}", prompt_token_ids=list(token_ids),
                      sampling_params=SamplingParams(max_tokens=1), pooling_params=None,
                      block_hasher=get_request_block_hasher(TOKENS_PER_BLOCK, hash_fn))
    return [make_offload_key(h, 0) for h in request.block_hashes]


def payload(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, ROW), dtype=np.uint8)


class Engine:
    """One engine: vLLM's spec and manager with kvtier as its one secondary tier."""

    def __init__(self, tier: dict[str, Any], **identity: Any) -> None:
        self.spec = TieringOffloadingSpec(offloading_config(tier, **identity))
        self.manager = self.spec.get_manager()
        [self.tier] = self.manager.secondary_tiers
        self.data = np.asarray(self.manager.primary_tier.get_kv_memoryview()).view(np.uint8)
        assert self.data.shape[1] >= ROW, self.data.shape

    def steps(self, limit: int = 2000) -> None:
        for _ in range(limit):
            with self.manager.lock:
                self.manager.on_schedule_end(ScheduleEndContext(new_req_ids=(), preempted_req_ids=()))
                if not self.manager.has_pending_work():
                    return
            time.sleep(0.005)
        raise AssertionError("the manager never went idle")

    def store(self, keys: list[bytes], rows: np.ndarray) -> None:
        """As the connector offloads: into the primary tier, which cascades
        to kvtier; returns once kvtier reported the store."""
        ctx = ReqContext(f"store-{uuid.uuid4().hex[:8]}")
        with self.manager.lock:
            self.manager.on_new_request(ctx)
            out = self.manager.prepare_store(keys, ctx)
            self.data[np.asarray(out.store_spec.chunk_ids), :ROW] = rows
            self.manager.complete_store(keys, ctx)
        self.steps()
        with self.manager.lock:
            self.manager.on_request_finished(ctx)
        assert self.tier.stats().stores_ok >= 1, self.tier.stats()

    def fetch(self, keys: list[bytes], timeout: float = 20.0) -> tuple[list[Any], np.ndarray | None]:
        """The scheduler's lookups until each settles (HIT once promoted from
        kvtier into the primary tier, or MISS), then the rows of the HITs."""
        ctx = ReqContext(f"load-{uuid.uuid4().hex[:8]}")
        deadline = time.monotonic() + timeout
        with self.manager.lock:
            self.manager.on_new_request(ctx)
        try:
            while True:
                with self.manager.lock:
                    got = [self.manager.lookup(k, ctx) for k in keys]
                if all(g in (HIT, MISS) for g in got):
                    break
                assert time.monotonic() < deadline, got
                self.steps()
            hits = [k for k, g in zip(keys, got) if g is HIT]
            if not hits:
                return got, None
            with self.manager.lock:
                spec = self.manager.prepare_load(hits, ctx)
                rows = self.data[np.asarray(spec.chunk_ids), :ROW].copy()
                self.manager.complete_load(hits, ctx)
            return got, rows
        finally:
            with self.manager.lock:
                self.manager.on_request_finished(ctx)

    def close(self) -> None:
        self.data = None  # type: ignore[assignment]
        self.manager.shutdown()  # the tiers, and the primary tier's region
