"""kvtier.sglang.KVTierStorage against the real SGLang 0.5.23 classes: the
backend made by SGLang's factory from the ``dynamic`` config, a real CPU host
pool, and the cache controller's own page get/set functions, on the memory,
disk and Redis backends. Skipped (with the reason) when SGLang cannot be
imported; see python/requirements-engines*.txt."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from sglang_helpers import (  # noqa: I001 (skips the module without SGLang)
    LAYOUTS,
    attach,
    fill,
    indices,
    load,
    make_backend,
    make_pool,
    new_keys,
    page,
    round_trip,
    store,
)

import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage

import kvtier
from kvtier.sglang import KVTierStorage


@pytest.fixture(params=["memory", "disk", "redis"])
def kv_config(request, tmp_path):
    """kvtier config for each backend (Redis: a server of the test's own)."""
    if request.param == "memory":
        return {"backend": "memory", "capacity_bytes": "64MiB"}
    if request.param == "disk":
        return {"backend": "disk", "path": str(tmp_path / "kv"), "capacity_bytes": "64MiB"}
    return {"backend": "redis", "url": request.getfixturevalue("redis_url"), "capacity_bytes": "64MiB"}


def test_the_factory_builds_it_from_the_dynamic_config():
    backend = make_backend()
    assert isinstance(backend, KVTierStorage) and isinstance(backend, HiCacheStorage)
    backend.close()
    with pytest.raises(kvtier.KVTierError) as err:
        make_backend({"no_such_key": 1})
    assert err.value.status == kvtier.TIER_ERR_CONFIG
    with pytest.raises(kvtier.KVTierError):
        make_backend({"capacity_bytes": "lots"})


@pytest.mark.parametrize("mla", [False, True], ids=["mha", "mla"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_round_trip_is_byte_exact_for_every_layout(kv_config, layout, mla):
    for v1 in (True, False):  # zero copy, and the legacy calls SGLang makes without interface_v1
        backend = make_backend(kv_config, mla=mla, v1=v1)
        try:
            round_trip(backend, layout, mla, v1)
        finally:
            backend.close()


def test_the_example_extra_config_attaches(tmp_path):
    config = json.loads((Path(__file__).resolve().parents[2] / "examples" / "sglang_extra_config.json").read_text())
    assert (config["module_path"], config["class_name"], config["interface_v1"]) == ("kvtier.sglang", "KVTierStorage", 1)
    config["path"] = str(tmp_path)
    backend = make_backend({k: v for k, v in config.items() if k not in ("module_path", "class_name")})
    round_trip(backend, "page_first")
    backend.close()


def test_sglang_056_storage_config_is_enough(tmp_path):
    """SGLang 0.5.6 (the first with interface_v1) passes a config of six
    fields: no metrics, pipeline, context-parallel nor is_storage_writer."""

    @dataclasses.dataclass
    class Config056:
        tp_rank: int
        tp_size: int
        is_mla_model: bool
        is_page_first_layout: bool
        model_name: str | None
        extra_config: dict | None = None

    extra = {"backend_name": "kvtier", "module_path": "kvtier.sglang", "class_name": "KVTierStorage",
             "interface_v1": 1, "backend": "disk", "path": str(tmp_path)}
    for rank in (0, 1):
        backend = KVTierStorage(Config056(rank, 2, True, True, "m", dict(extra)), {})
        assert backend.is_writer == (rank == 0)
        if rank == 0:
            _, keys = round_trip(backend, "page_first", mla=True)
            assert backend.get_stats().backup_pgs == []
        else:
            attach(backend, make_pool("page_first", mla=True))
            assert backend.batch_exists(keys) == 4  # MLA on disk: shared, the writer's pages
        backend.close()


def test_namespaces_keep_apart_what_must_not_mix(tmp_path):
    disk = {"backend": "disk", "path": str(tmp_path)}
    pool = make_pool("page_first")
    d = "/[0-9a-f]{12}"  # the digest of every identity field
    cases = [
        (dict(tp_rank=1, tp_size=2), {}, "sglang/org-model/page_first/bfloat16/mha/p4/tp1of2" + d),
        (dict(tp_rank=1, tp_size=2, mla=True), {}, "sglang/org-model/page_first/bfloat16/mla/p4" + d),
        (dict(dp_rank=1), disk, "sglang/org-model/page_first/bfloat16/mha/p4/tp0of1/dp1" + d),
        (dict(dp_rank=1), dict(disk, shared=True), "sglang/org-model/page_first/bfloat16/mha/p4/tp0of1" + d),
        (dict(), {"namespace": "prod"}, "sglang/org-model/page_first/bfloat16/mha/p4/tp0of1" + d + "/prod"),
    ]
    names = []
    for kwargs, cfg, want in cases:
        backend = make_backend(cfg, **kwargs)
        names.append(backend.namespace(pool))
        assert re.fullmatch(want, names[-1]), (names[-1], want)
        backend.close()
    first = make_backend(dict(disk, shared=True))
    # Attention-DP replicas on shared storage hold the same pages: one namespace.
    assert first.namespace(pool) == names[3]
    first.close()


def test_segments_map_to_rows_of_the_pool_itself():
    """Zero copy: the tier's rows are the pool's own segments."""
    for layout, segments in (("page_first", 2), ("page_first_direct", 2), ("layer_first", 6)):
        backend = make_backend()
        pool = make_pool(layout)
        attach(backend, pool)
        geo = backend._geo
        assert geo.segments == segments and geo.base == pool.kv_buffer.data_ptr()
        assert geo.seg_bytes * geo.segments == pool.get_data_page(0, flat=True).numel() * 2
        ptrs, _ = pool.get_page_buffer_meta(indices([5]))
        assert [geo.base + r * geo.seg_bytes for r in geo.rows(pool, indices([5]), 1)] == ptrs
        backend.close()


def test_a_load_stops_at_the_first_missing_page(kv_config):
    for v1 in (True, False):
        backend = make_backend(kv_config, v1=v1)
        pool = make_pool("page_first")
        ctrl = attach(backend, pool)
        fill(pool)
        keys = new_keys(5)
        assert store(ctrl, keys[:2], indices([0, 1]), v1)
        assert store(ctrl, keys[3:], indices([3, 4]), v1)  # page 2 never stored
        assert backend.batch_exists(keys) == 2
        assert backend.batch_exists(keys[3:]) == 2
        pool.kv_buffer.zero_()
        assert load(ctrl, keys, indices(range(5)), v1) == 2
        if v1:
            assert backend.batch_get_v1(keys, indices(range(5))) == [True, True, False, False, False]
        backend.close()


def test_tp_ranks_never_read_each_others_pages(kv_config):
    first = make_backend(kv_config, tp_rank=0, tp_size=2)
    second = make_backend(kv_config, tp_rank=1, tp_size=2)
    pools = [make_pool("page_first"), make_pool("page_first")]
    ctrls = [attach(first, pools[0]), attach(second, pools[1])]
    fill(pools[0], seed=1)
    fill(pools[1], seed=2)
    keys = new_keys(3)
    assert store(ctrls[0], keys, indices(range(3)))
    assert second.batch_exists(keys) == 0
    assert store(ctrls[1], keys, indices(range(3)))  # the same keys, the other rank's heads
    expected = [[page(p, i) for i in range(3)] for p in pools]
    for pool, ctrl, want in zip(pools, ctrls, expected):
        pool.kv_buffer.zero_()
        assert load(ctrl, keys, indices(range(3))) == 3
        assert all(torch.equal(page(pool, i), want[i]) for i in range(3))
    second.clear()
    assert second.batch_exists(keys) == 0 and first.batch_exists(keys) == 3
    first.close()
    second.close()


def test_mla_ranks_share_pages_and_only_the_writer_stores(kv_config):
    writer = make_backend(kv_config, tp_rank=0, tp_size=2, mla=True)
    reader = make_backend(kv_config, tp_rank=1, tp_size=2, mla=True)
    pool_w, pool_r = make_pool("page_first", mla=True), make_pool("page_first", mla=True)
    ctrl_w, ctrl_r = attach(writer, pool_w), attach(reader, pool_r)
    fill(pool_w, seed=3)
    fill(pool_r, seed=4)
    keys = new_keys(3)
    assert store(ctrl_r, keys, indices(range(3)))  # a no-op that reports success
    assert reader.stats().stores_ok == 0 and writer.batch_exists(keys) == 0
    assert store(ctrl_w, keys, indices(range(3)))
    want = [page(pool_w, i) for i in range(3)]
    if kv_config["backend"] == "memory":
        # A rank's memory is its own: the others cannot see the writer's pages.
        assert reader.batch_exists(keys) == 0
    else:
        assert reader.batch_exists(keys) == 3
        assert load(ctrl_r, keys, indices(range(3))) == 3
        assert all(torch.equal(page(pool_r, i), want[i]) for i in range(3))
    writer.close()
    reader.close()


def test_lru_eviction_under_capacity(kv_config):
    pool = make_pool("page_first")
    seg = pool.get_data_page(0, flat=True).numel()  # bytes of K and V (bf16) / 2 = one segment
    backend = make_backend(dict(kv_config, capacity_bytes=8 * 2 * seg))  # 8 pages
    ctrl = attach(backend, pool)
    fill(pool)
    batches = [new_keys(4) for _ in range(3)]
    for keys in batches:
        assert store(ctrl, keys, indices(range(4)))
    assert backend.batch_exists(batches[0]) == 0
    assert backend.batch_exists(batches[1]) == 4 and backend.batch_exists(batches[2]) == 4
    assert backend.stats().evictions == 8
    want = [page(pool, i) for i in range(4)]
    pool.kv_buffer.zero_()
    assert load(ctrl, batches[2], indices(range(4))) == 4
    assert all(torch.equal(page(pool, i), want[i]) for i in range(4))
    backend.close()


def test_failures_are_misses_and_never_raise(kv_config):
    backend = make_backend(kv_config)
    keys = new_keys(2)
    # Before the pool is registered.
    assert backend.batch_exists(keys) == 0
    assert backend.batch_get_v1(keys, indices([0, 1])) == [False, False]
    assert backend.batch_set_v1(keys, indices([0, 1])) == [False, False]
    assert not backend.exists(keys[0]) and backend.get(keys[0]) is None
    pool = make_pool("page_first")
    ctrl = attach(backend, pool)
    # Too few host indices; indices outside the pool.
    assert backend.batch_set_v1(keys, indices([0])) == [False, False]
    assert backend.batch_set_v1(keys, torch.tensor([10**9] * 8)) == [False, False]
    # Legacy data calls on a zero-copy backend: a miss, not an error.
    assert backend.set(keys[0], pool.get_data_page(0)) is False
    assert store(ctrl, keys, indices([0, 1]))
    backend.close()
    assert backend.batch_exists(keys) == 0
    assert backend.batch_get_v1(keys, indices([0, 1])) == [False, False]
    assert backend.batch_set_v1(keys, indices([0, 1])) == [False, False]
    backend.clear()
    backend.close()


def test_hybrid_v2_calls_are_not_implemented():
    """Documented: SGLang's default for backends without side pools."""
    backend = make_backend()
    attach(backend, make_pool("page_first"))
    with pytest.raises(NotImplementedError):
        backend.batch_exists_v2(new_keys(1))
    with pytest.raises(NotImplementedError):
        backend.batch_get_v2([])
    backend.close()


def test_get_stats_is_sglangs_storage_metrics():
    from sglang.srt.observability.metrics_collector import StorageMetrics

    backend = make_backend(metrics=True)
    pool, keys = round_trip(backend, "page_first")
    stats = backend.get_stats()
    assert isinstance(stats, StorageMetrics)
    assert stats.backup_pgs == [4] and stats.prefetch_pgs == [4]
    assert len(stats.backup_bandwidth) == 1 and stats.prefetch_bandwidth[0] > 0
    assert backend.get_stats().prefetch_pgs == []  # taken once
    assert backend.stats().stores_ok == 1 and "kvtier_" in backend.tier.metrics()
    backend.clear()
    assert backend.batch_exists(keys) == 0
    backend.close()


def test_keys_of_any_form_are_pages_too():
    """SGLang's keys are 64 hex digits; other strings are hashed to that form."""
    backend = make_backend()
    pool = make_pool("page_first")
    ctrl = attach(backend, pool)
    fill(pool)
    keys = ["short", "ключ", "x" * 200, new_keys(1)[0]]
    assert store(ctrl, keys, indices(range(4)))
    assert backend.batch_exists(keys) == 4 and backend.batch_exists(["other"]) == 0
    backend.close()
