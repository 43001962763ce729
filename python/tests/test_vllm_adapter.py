"""KVTierSecondaryTier against the real vLLM 0.33 classes.

Mirrors the memory-tier behaviours of vLLM's own tier tests (contract digest
§6) and runs one real TieringOffloadingManager with kvtier as its secondary
tier. Skipped when vLLM cannot be imported: run with
``KVTIER_PYTHON=/path/to/venv-with-vllm/bin/python python/run_tests.sh``.
"""

from __future__ import annotations

import dataclasses
import os
import time
import uuid
from types import SimpleNamespace

import numpy as np
import pytest

try:
    from vllm.v1.kv_offload.base import (
        Locality,
        LookupResult,
        Medium,
        ReqContext,
        RequestOffloadingContext,
        ScheduleEndContext,
        make_offload_key,
    )
    from vllm.v1.kv_offload.tiering.base import SecondaryTierManager, TransferJob
    from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory
    from vllm.v1.metrics.cache_hit_source import CacheHitSource
except Exception as exc:  # ImportError, or a vLLM that fails to import
    pytest.skip(
        f"vLLM is not importable ({exc!r}); the adapter tests need vLLM 0.33: "
        "run KVTIER_PYTHON=<python with vllm> python/run_tests.sh",
        allow_module_level=True,
    )

import kvtier
import kvtier._vllm_compat as vllm_compat
from kvtier.vllm import KVTierSecondaryTier

ROW = 4096
HIT, MISS, RETRY = LookupResult.HIT, LookupResult.MISS, LookupResult.RETRY


def spec(events: bool = False):
    return SimpleNamespace(
        kv_events_config=SimpleNamespace(
            enable_kv_cache_events=events, self_describing_kv_events=False
        )
    )


def to_key(n: int) -> bytes:
    return make_offload_key(int(n).to_bytes(8, "big"), 0)


def keys(*ns: int) -> list[bytes]:
    return [to_key(n) for n in ns]


def job(job_id, ks, rows, load=False, ctx=None):
    return TransferJob(
        job_id=job_id,
        keys=list(ks),
        # vLLM passes int32; wider only to provoke ids beyond int32 range.
        chunk_ids=np.array(rows, dtype=np.int32 if all(abs(r) < 2**31 for r in rows) else np.int64),
        is_promotion=load,
        req_context=ctx or ReqContext(req_id="r"),
    )


def threads_now() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.fixture
def make():
    made = []

    def _make(rows=8, row=ROW, arr=None, offloading_spec=None, **cfg):
        cfg.setdefault("capacity_bytes", "4MiB")
        cfg.setdefault("io_threads", 2)
        if arr is None:
            arr = np.zeros((rows, row), dtype=np.int8)
        tier = KVTierSecondaryTier(
            offloading_spec=offloading_spec or spec(),
            primary_kv_view=memoryview(arr),
            tier_type="KVTierSecondaryTier",
            **cfg,
        )
        made.append(tier)
        return tier, arr

    yield _make
    for tier in made:
        tier.shutdown()


def finished(tier, count: int, timeout: float = 5.0) -> list:
    """get_finished_jobs until `count` results; asserts no duplicates/extras."""
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < count:
        assert time.monotonic() < deadline, f"only {len(got)} of {count}: {got}"
        got.extend(tier.get_finished_jobs())
        time.sleep(0.002)
    tier.drain_jobs()  # anything still running would be a job reported twice
    got.extend(tier.get_finished_jobs())
    assert len(got) == count, got
    assert len({r.job_id for r in got}) == count
    return got


def cycle(tier, ks, ctx):
    """vLLM's lookup cycle: look up, end the step, look up again (and end
    that step too)."""
    end = ScheduleEndContext(new_req_ids=(), preempted_req_ids=())
    for k in ks:
        tier.lookup(k, ctx)
    tier.on_schedule_end(end)
    got = [tier.lookup(k, ctx) for k in ks]
    tier.on_schedule_end(end)
    return got


def fill(arr, rows, seed=7):
    rng = np.random.default_rng(seed)
    for r in rows:
        arr[r] = rng.integers(-128, 128, size=arr.shape[1], dtype=np.int8)


# -- the contract ---------------------------------------------------------------


def test_is_a_cpu_secondary_tier(make):
    tier, _ = make()
    assert isinstance(tier, SecondaryTierManager)
    # The arena is this process's memory: host memory, local.
    assert tier.medium is Medium.CPU and tier.locality is Locality.LOCAL
    assert tier.cache_hit_source is CacheHitSource.HOST
    assert tier.block_size_bytes == ROW
    assert isinstance(tier.on_new_request(ReqContext("r")), RequestOffloadingContext)
    assert tier.has_pending_work() is False


def test_miss_on_empty(make):
    tier, _ = make()
    assert cycle(tier, keys(1, 2, 3), ReqContext("r")) == [MISS] * 3


def test_store_then_hit(make):
    tier, arr = make()
    tier.submit_store(job(1, keys(1), [0]))
    assert tier.has_pending_work()
    [r] = finished(tier, 1)
    assert (r.job_id, r.success, r.successful_keys) == (1, True, None)
    assert r.transfer_bytes == ROW and r.transfer_time >= 0
    assert cycle(tier, keys(1), ReqContext("r")) == [HIT]
    assert not tier.has_pending_work()


@pytest.mark.parametrize("n", [0, 1, 2, 5])
def test_round_trip_into_other_rows(make, n):
    rows = 12
    tier, arr = make(rows=rows)
    fill(arr, range(n))
    original = arr[:n].copy()
    ks = keys(*range(n))
    tier.submit_store(job(1, ks, list(range(n))))
    assert [(r.job_id, r.success) for r in finished(tier, 1)] == [(1, True)]
    arr[rows - n :] = 0
    tier.submit_load(job(2, ks, list(range(rows - n, rows)), load=True))
    assert [(r.job_id, r.success) for r in finished(tier, 1)] == [(2, True)]
    assert arr[rows - n :].tobytes() == original.tobytes()
    assert cycle(tier, ks, ReqContext("r")) == [HIT] * n


@pytest.mark.parametrize("bad_row", [8, -1, 2**40])
def test_out_of_range_row_fails_cleanly(make, bad_row):
    tier, arr = make(rows=8)
    tier.submit_store(job(1, keys(1, 2), [0, bad_row]))
    assert tier.has_pending_work()
    [r] = finished(tier, 1)
    assert (r.job_id, r.success) == (1, False)
    assert cycle(tier, keys(1, 2), ReqContext("r")) == [MISS, MISS]
    tier.submit_store(job(2, keys(1), [0]))
    finished(tier, 1)
    ctx = ReqContext("r2")
    tier.submit_load(job(3, keys(1), [bad_row], load=True, ctx=ctx))
    [r] = finished(tier, 1)
    assert (r.job_id, r.success, r.successful_keys) == (3, False, None)
    assert tier.lookup(to_key(1), ctx) is MISS  # the failed key, for that request
    assert tier.lookup(to_key(1), ReqContext("other")) is HIT


def test_load_never_stored_key_fails(make):
    tier, _ = make()
    tier.submit_load(job(1, keys(9), [0], load=True))
    [r] = finished(tier, 1)
    assert (r.job_id, r.success, r.successful_keys) == (1, False, None)


def test_partial_load_reports_leading_keys(make):
    tier, arr = make(rows=8)
    fill(arr, [0, 1])
    k1, k2, k3 = keys(1, 2, 3)
    tier.submit_store(job(1, [k1, k2], [0, 1]))
    finished(tier, 1)
    ctx = ReqContext("req")
    tier.submit_load(job(2, [k1, k2, k3], [5, 6, 7], load=True, ctx=ctx))
    [r] = finished(tier, 1)
    assert (r.job_id, r.success, tuple(r.successful_keys)) == (2, False, (k1, k2))
    assert set(r.successful_keys) <= {k1, k2, k3}
    assert arr[5:7].tobytes() == arr[0:2].tobytes()
    assert cycle(tier, [k1, k2, k3], ctx) == [HIT, HIT, MISS]
    assert cycle(tier, [k1, k2, k3], ReqContext("fresh")) == [HIT, HIT, MISS]


def test_failed_first_key_misses_all_for_that_request(make):
    tier, arr = make(rows=8)
    k1, k2, k3 = keys(1, 2, 3)
    tier.submit_store(job(1, [k1, k2], [0, 1]))
    finished(tier, 1)
    ctx = ReqContext("req")
    tier.submit_load(job(2, [k3, k1, k2], [5, 6, 7], load=True, ctx=ctx))
    [r] = finished(tier, 1)
    assert (r.success, r.successful_keys) == (False, None)
    # k1 and k2 are in the tier, but this request must not promote them again.
    assert cycle(tier, [k3, k1, k2], ctx) == [MISS, MISS, MISS]
    assert cycle(tier, [k3, k1, k2], ReqContext("fresh")) == [MISS, HIT, HIT]
    tier.on_request_finished(ctx)  # per-request verdicts are dropped
    assert tier.lookup(k1, ReqContext("req")) is HIT
    assert tier._failed_keys == {}


def test_two_jobs_report_both_ids(make):
    tier, _ = make()
    tier.submit_store(job(1, keys(1), [0]))
    tier.submit_store(job(2, keys(2), [1]))
    assert {r.job_id for r in finished(tier, 2)} == {1, 2}
    assert cycle(tier, keys(1, 2), ReqContext("r")) == [HIT, HIT]


def test_drain_then_poll_yields_everything(make):
    tier, arr = make(rows=32, row=256 * 1024, capacity_bytes="64MiB", io_threads=1)
    for j in range(16):
        tier.submit_store(job(j, keys(2 * j, 2 * j + 1), [2 * j, 2 * j + 1]))
    for j in range(16, 20):
        tier.submit_load(job(j, keys(2 * (j - 16)), [31], load=True))
    tier.submit_store(job(99, keys(1), [99]))  # rejected: reported too
    tier.drain_jobs()
    results = list(tier.get_finished_jobs())
    assert sorted(r.job_id for r in results) == list(range(20)) + [99]
    assert all(r.success for r in results if r.job_id < 16)
    assert not tier.has_pending_work()
    assert list(tier.get_finished_jobs()) == []


def test_shutdown_with_jobs_queued_returns_promptly(make):
    base = threads_now()
    arr = np.zeros((32, 2 << 20), dtype=np.int8)
    tier, _ = make(arr=arr, capacity_bytes="1GiB", io_threads=1)
    assert threads_now() > base
    for j in range(10):
        tier.submit_store(job(j, keys(*range(100 * j, 100 * j + 16)), list(range(16))))
    t0 = time.monotonic()
    tier.shutdown()
    assert time.monotonic() - t0 < 1.0
    assert threads_now() == base  # the I/O threads are gone
    tier.shutdown()  # idempotent
    arr[:] = 1  # the library no longer touches the buffer


def test_lookup_keeps_input_order(make):
    tier, _ = make()
    tier.submit_store(job(1, keys(2, 4), [0, 1]))
    finished(tier, 1)
    assert cycle(tier, keys(1, 2, 3, 4, 5), ReqContext("r")) == [MISS, HIT, MISS, HIT, MISS]


def test_float32_view_with_2mib_rows(make):
    arr = np.zeros((8, 524288), dtype=np.float32)
    view = memoryview(arr)
    assert view.strides == (2 << 20, 4)
    tier, _ = make(arr=arr, capacity_bytes="64MiB")
    assert tier.block_size_bytes == 2 << 20
    rng = np.random.default_rng(3)
    arr[:4] = rng.standard_normal((4, 524288), dtype=np.float32)
    ks = keys(1, 2, 3, 4)
    tier.submit_store(job(1, ks, [0, 1, 2, 3]))
    [r] = finished(tier, 1)
    assert r.success and r.transfer_bytes == 4 * (2 << 20)
    tier.submit_load(job(2, ks, [7, 6, 5, 4], load=True))
    assert finished(tier, 1)[0].success
    assert arr[[7, 6, 5, 4]].tobytes() == arr[:4].tobytes()


def test_store_events(make):
    tier, _ = make(offloading_spec=spec(events=True), enable_kv_events=True, locality="LOCAL")
    assert list(tier.take_events()) == []
    tier.submit_store(job(1, keys(3, 1, 2), [0, 1, 2]))
    finished(tier, 1)
    [event] = list(tier.take_events())
    assert event.keys == keys(3, 1, 2)
    assert (event.medium, event.removed, event.locality) == (Medium.CPU, False, Locality.LOCAL)
    assert list(tier.take_events()) == []
    tier.submit_load(job(2, keys(3), [4], load=True))  # loads emit nothing
    tier.submit_store(job(3, keys(7), [99]))  # failed stores emit nothing
    finished(tier, 2)
    assert list(tier.take_events()) == []


def test_events_need_the_global_flag(make):
    tier, _ = make(offloading_spec=spec(events=False), enable_kv_events=True)
    tier.submit_store(job(1, keys(1), [0]))
    finished(tier, 1)
    assert list(tier.take_events()) == []


def test_locality_is_validated(make):
    tier, _ = make(locality="REMOTE")
    assert tier.locality is Locality.REMOTE
    with pytest.raises(ValueError):
        make(locality="local")


def test_touch_reaches_the_library(make):
    tier, _ = make(rows=4, capacity_bytes=2 * ROW)
    a, b, c = keys(1, 2, 3)
    tier.submit_store(job(1, [a, b], [0, 1]))  # a ends most recent
    finished(tier, 1)
    tier.touch([b], ReqContext("r"))  # now a is least recent
    tier.touch([], ReqContext("r"))
    tier.submit_store(job(2, [c], [2]))
    assert finished(tier, 1)[0].success
    assert cycle(tier, [a, b, c], ReqContext("r")) == [MISS, HIT, HIT]


def test_store_without_space_fails_the_job(make):
    tier, _ = make(rows=8, capacity_bytes=2 * ROW)
    tier.submit_store(job(1, keys(1, 2, 3), [0, 1, 2]))
    [r] = finished(tier, 1)
    assert r.success is False
    assert cycle(tier, keys(1, 2, 3), ReqContext("r")) == [MISS] * 3


# -- never raise into the scheduler -------------------------------------------------


def test_pending_maps_to_retry_and_errors_to_miss(make, monkeypatch):
    # Without the mirror every lookup is the library's answer.
    tier, _ = make(lookup_mirror=False)
    monkeypatch.setattr(tier._tier, "lookup_one", lambda key: kvtier.LookupState.PENDING)
    assert tier.lookup(to_key(1), ReqContext("r")) is RETRY

    def boom(key):
        raise RuntimeError("boom")

    monkeypatch.setattr(tier._tier, "lookup_one", boom)
    assert tier.lookup(to_key(1), ReqContext("r")) is MISS


def test_real_pending_store_is_retry(make):
    arr = np.zeros((64, 1 << 20), dtype=np.int8)
    tier, _ = make(arr=arr, capacity_bytes="128MiB", io_threads=1)
    ks = keys(*range(64))
    tier.submit_store(job(1, ks, list(range(64))))
    assert tier.lookup(ks[-1], ReqContext("r")) in (RETRY, HIT)
    finished(tier, 1)
    assert tier.lookup(ks[-1], ReqContext("r")) is HIT


@pytest.mark.parametrize(
    "bad_keys",
    [
        [b"x" * 200],  # longer than the library accepts
        [b"abc", b"abcdef"],  # mixed lengths
        [1, 2],  # not bytes at all
    ],
)
def test_rejected_submit_becomes_a_failed_result(make, bad_keys):
    tier, _ = make()
    ctx = ReqContext("r")
    tier.submit_store(job(1, bad_keys, list(range(len(bad_keys)))))
    tier.submit_load(job(2, bad_keys, list(range(len(bad_keys))), load=True, ctx=ctx))
    results = finished(tier, 2)
    assert sorted((r.job_id, r.success, r.successful_keys) for r in results) == [
        (1, False, None),
        (2, False, None),
    ]


def test_mismatched_rows_and_missing_fields_are_reported(make):
    tier, _ = make()
    tier.submit_store(job(1, keys(1, 2), [0]))  # two keys, one row
    tier.submit_store(SimpleNamespace(job_id=2, keys=keys(1)))  # no rows at all
    assert sorted((r.job_id, r.success) for r in finished(tier, 2)) == [(1, False), (2, False)]


def test_duplicate_job_id_is_reported_once(make):
    tier, _ = make(rows=64, row=1 << 20, capacity_bytes="128MiB", io_threads=1)
    tier.submit_store(job(5, keys(*range(64)), list(range(64))))
    tier.submit_store(job(5, keys(1000), [0]))
    assert [r.job_id for r in finished(tier, 1)] == [5]


def test_nothing_raises_after_shutdown(make):
    tier, _ = make()
    tier.submit_store(job(1, keys(1), [0]))
    tier.shutdown()
    ctx = ReqContext("r")
    assert tier.lookup(to_key(1), ctx) is MISS
    tier.touch(keys(1), ctx)
    tier.submit_store(job(2, keys(1), [0]))
    tier.submit_load(job(3, keys(1), [1], load=True, ctx=ctx))
    assert sorted(r.job_id for r in tier.get_finished_jobs()) == [2, 3]
    tier.drain_jobs()
    tier.on_request_finished(ctx)
    assert list(tier.take_events()) == []
    assert tier.has_pending_work() is False
    tier.shutdown()


def test_bad_kvtier_config_fails_at_construction(make):
    with pytest.raises(kvtier.KVTierError) as info:
        make(no_such_option=1)
    assert info.value.status == kvtier.TIER_ERR_CONFIG
    with pytest.raises(kvtier.KVTierError):
        make(capacity_bytes=100)  # below one row


# -- vLLM plumbing ------------------------------------------------------------------


def test_factory_loads_it_from_module_path():
    config = {
        "type": "KVTierSecondaryTier",
        "module_path": "kvtier.vllm",
        "capacity_bytes": "2MiB",
        "io_threads": 3,
    }
    assert SecondaryTierFactory.get_tier_class(config) is KVTierSecondaryTier
    arr = np.zeros((4, ROW), dtype=np.int8)
    tier = SecondaryTierFactory.create_secondary_tier(config, memoryview(arr), spec())
    try:
        assert isinstance(tier, KVTierSecondaryTier)
        assert tier.tier_type == "KVTierSecondaryTier"
        stats = tier.stats()
        assert (stats.capacity_bytes, stats.io_threads, stats.block_bytes) == (2 << 20, 3, ROW)
        assert config["type"] == "KVTierSecondaryTier"  # the factory copies it
    finally:
        tier.shutdown()


def test_older_names_and_result_fields(make, monkeypatch):
    @dataclasses.dataclass
    class OldJobResult:
        job_id: int
        success: bool

    monkeypatch.setattr(vllm_compat, "VllmJobResult", OldJobResult)
    monkeypatch.setattr(vllm_compat, "_RESULT_FIELDS", frozenset({"job_id", "success"}))
    tier, arr = make()
    old_job = SimpleNamespace(job_id=1, keys=keys(1), block_ids=[0], req_context=ReqContext("r"))
    tier.submit_store(old_job)
    load = SimpleNamespace(job_id=2, keys=keys(1, 2), block_ids=[3, 4], req_context=ReqContext("r"))
    tier.submit_load(load)
    results = []
    deadline = time.monotonic() + 5
    while len(results) < 2 and time.monotonic() < deadline:
        results.extend(tier.get_finished())  # the older method name
    assert sorted((r.job_id, r.success) for r in results) == [(1, True), (2, False)]
    assert all(type(r) is OldJobResult for r in results)
    tier.request_finished(ReqContext("r"))


def test_accepts_unexpected_vllm_kwargs():
    arr = np.zeros((4, ROW), dtype=np.int8)
    tier = KVTierSecondaryTier(spec(), memoryview(arr), tier_name="kv0", capacity_bytes="1MiB")
    try:
        assert tier.tier_type == "kv0"
    finally:
        tier.shutdown()


# -- one real TieringOffloadingManager --------------------------------------------


def test_tiering_manager_cascades_and_promotes():
    from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
    from vllm.v1.kv_offload.tiering.manager import (
        CPUPrimaryTierOffloadingManager,
        TieringOffloadingManager,
    )

    rows, row = 4, 64 * 1024
    region = SharedOffloadRegion(
        engine_id=f"kvtier-test-{uuid.uuid4().hex[:12]}",
        num_chunks=rows,
        rank=None,
        kv_bytes_per_chunk=row,
        cpu_page_size=row,
    )
    primary = CPUPrimaryTierOffloadingManager(num_chunks=rows, mmap_region=region)
    view = primary.get_kv_memoryview()
    tier = SecondaryTierFactory.create_secondary_tier(
        {"type": "KVTierSecondaryTier", "module_path": "kvtier.vllm", "capacity_bytes": "1MiB", "io_threads": 2},
        view,
        spec(),
    )
    manager = TieringOffloadingManager(primary_tier=primary, secondary_tiers=[tier])
    data = np.asarray(view)
    assert data.shape == (rows, row)

    loads = []
    real_submit_load = tier.submit_load

    def spy_load(job_metadata):
        loads.append((job_metadata.job_id, job_metadata.req_context.req_id, list(job_metadata.keys)))
        real_submit_load(job_metadata)

    tier.submit_load = spy_load

    def steps(limit=500):
        for _ in range(limit):
            with manager.lock:
                manager.on_schedule_end(ScheduleEndContext(new_req_ids=(), preempted_req_ids=()))
                if not manager.has_pending_work():
                    return
            time.sleep(0.005)
        raise AssertionError("the manager never went idle")

    def store(req_id, ks, seed):
        ctx = ReqContext(req_id)
        with manager.lock:
            manager.on_new_request(ctx)
            out = manager.prepare_store(ks, ctx)
            assert out is not None and out.keys_to_store == ks
            payload = np.random.default_rng(seed).integers(-128, 128, size=(len(ks), row), dtype=np.int8)
            data[np.asarray(out.store_spec.chunk_ids)] = payload  # the "GPU -> CPU" copy
            manager.complete_store(ks, ctx)  # cascades to kvtier
        steps()
        with manager.lock:
            manager.on_request_finished(ctx)
        return payload, out

    try:
        keys_a = keys(0, 1, 2, 3)
        payload_a, _ = store("A", keys_a, seed=1)
        assert [tier.lookup(k, ReqContext("x")) for k in keys_a] == [HIT] * 4
        assert tier.stats().stores_ok == 1

        # B fills the primary tier: A's chunks are evicted there, kept in kvtier.
        keys_b = keys(10, 11, 12, 13)
        _, out_b = store("B", keys_b, seed=2)
        assert set(out_b.evicted_keys) == set(keys_a)
        ctx = ReqContext("C")
        with manager.lock:
            manager.on_new_request(ctx)
            assert [primary.lookup(k, ctx) for k in keys_a] == [MISS] * 4
            assert [manager.lookup(k, ctx) for k in keys_a] == [LookupResult.HIT_PENDING] * 4
            assert loads == []  # promotion is submitted at step end, not in lookup
        steps()
        assert len(loads) == 1 and loads[0][1] == "C" and loads[0][2] == keys_a
        with manager.lock:
            assert [manager.lookup(k, ctx) for k in keys_a] == [HIT] * 4
            spec_c = manager.prepare_load(keys_a, ctx)
            assert data[np.asarray(spec_c.chunk_ids)].tobytes() == payload_a.tobytes()
            manager.complete_load(keys_a, ctx)
            manager.on_request_finished(ctx)
        stats = tier.stats()
        assert (stats.stores_ok, stats.loads_ok, stats.loads_failed) == (2, 1, 0)

        # reset_cache drains kvtier and asserts every job was reported.
        ctx = ReqContext("D")
        with manager.lock:
            manager.on_new_request(ctx)
            out = manager.prepare_store(keys(20), ctx)
            data[np.asarray(out.store_spec.chunk_ids)] = 5
            manager.complete_store(keys(20), ctx)
            assert tier.has_pending_work() or manager.has_pending_work()
            manager.reset_cache()
            assert not manager.has_pending_work()
            manager.on_reset_flushed()
            manager.on_request_finished(ctx)
        assert tier.lookup(to_key(20), ReqContext("x")) is HIT
    finally:
        data = view = None  # drop the test's own exports of the mapping
        manager.shutdown()
    assert region.mmap_obj is None  # nothing of ours kept the mapping exported
    assert not os.path.exists(region.mmap_path)


# -- issue 10 item 6: matched to vLLM 0.33 field for field ------------------------


def primary_and_manager(tier_config, rows=4, row=64 * 1024, offloading_spec=None):
    """A real TieringOffloadingManager over a real primary tier, with kvtier
    built from `tier_config` by vLLM's factory. Returns (manager, tier, data,
    close)."""
    from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
    from vllm.v1.kv_offload.tiering.manager import (
        CPUPrimaryTierOffloadingManager,
        TieringOffloadingManager,
    )

    region = SharedOffloadRegion(
        engine_id=f"kvtier-test-{uuid.uuid4().hex[:12]}",
        num_chunks=rows,
        rank=None,
        kv_bytes_per_chunk=row,
        cpu_page_size=row,
    )
    primary = CPUPrimaryTierOffloadingManager(num_chunks=rows, mmap_region=region)
    view = primary.get_kv_memoryview()
    tier = SecondaryTierFactory.create_secondary_tier(dict(tier_config), view, offloading_spec or spec())
    manager = TieringOffloadingManager(primary_tier=primary, secondary_tiers=[tier])
    data = np.asarray(view)

    def steps(limit=500):
        for _ in range(limit):
            with manager.lock:
                manager.on_schedule_end(ScheduleEndContext(new_req_ids=(), preempted_req_ids=()))
                if not manager.has_pending_work():
                    return
            time.sleep(0.005)
        raise AssertionError("the manager never went idle")

    def store(req_id, ks):
        ctx = ReqContext(req_id)
        with manager.lock:
            manager.on_new_request(ctx)
            out = manager.prepare_store(ks, ctx)
            data[np.asarray(out.store_spec.chunk_ids)] = 3
            manager.complete_store(ks, ctx)  # cascades to kvtier
        steps()
        with manager.lock:
            manager.on_request_finished(ctx)

    return SimpleNamespace(manager=manager, tier=tier, data=data, steps=steps, store=store)


def removed_and_stored(events):
    stored = [k for e in events if not e.removed for k in e.keys]
    removed = [k for e in events if e.removed for k in e.keys]
    return stored, removed


def test_evicted_block_gives_exactly_one_removed_event(make):
    tier, _ = make(
        rows=4, capacity_bytes=2 * ROW, offloading_spec=spec(events=True),
        enable_kv_events=True, locality="REMOTE",
    )
    a, b, c = keys(1, 2, 3)
    tier.submit_store(job(1, [a, b], [0, 1]))
    finished(tier, 1)
    # A job's first key ends most recent: b is the least recently used.
    tier.submit_store(job(2, [c], [2]))  # evicts b
    finished(tier, 1)
    events = list(tier.take_events())
    stored, removed = removed_and_stored(events)
    assert stored == [a, b, c]
    assert removed == [b]  # exactly one REMOVED, for the evicted block only
    for e in events:
        assert (e.medium, e.locality, e.ownership) == (Medium.CPU, Locality.REMOTE, "kvtier")
        # vLLM keeps a stored block's payload until its removal only when the
        # tier promises one.
        assert e.removal_expected is True
    assert list(tier.take_events()) == []
    assert cycle(tier, [a, b, c], ReqContext("r")) == [HIT, MISS, HIT]
    # A block stored again after its removal is stored (and evictable) again.
    tier.submit_store(job(3, [b], [1]))  # evicts a
    finished(tier, 1)
    stored, removed = removed_and_stored(tier.take_events())
    assert (stored, removed) == ([b], [a])


def test_removed_events_reach_vllms_events_tracker(make):
    """Through vLLM's own OffloadingEventsTracker: one BlockStored and one
    BlockRemoved for an evicted block."""
    from vllm.distributed.kv_events import BlockRemoved, BlockStored
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.events import (
        OffloadingEventsTracker,
    )
    from vllm.v1.kv_offload.base import OffloadingKVEventsConfig

    tier, _ = make(rows=4, capacity_bytes=ROW, offloading_spec=spec(events=True), enable_kv_events=True)
    a, b = keys(1, 2)
    tier.submit_store(job(1, [a], [0]))
    finished(tier, 1)
    tier.submit_store(job(2, [b], [1]))  # evicts a
    finished(tier, 1)
    tracker = OffloadingEventsTracker(OffloadingKVEventsConfig(True, False))
    out = list(tracker.take_events(tier.take_events()))
    assert [type(e) for e in out] == [BlockStored, BlockRemoved, BlockStored]
    assert out[1].block_hashes == out[0].block_hashes


def test_read_block_outlives_unread_one(make):
    tier, arr = make(rows=8, capacity_bytes=2 * ROW)
    fill(arr, [0, 1])
    a, b, c = keys(1, 2, 3)
    tier.submit_store(job(1, [b, a], [1, 0]))  # a job's first key ends most recent: a is least
    finished(tier, 1)
    tier.submit_load(job(2, [a], [5], load=True))  # a read counts as a use
    assert finished(tier, 1)[0].success
    tier.submit_store(job(3, [c], [2]))  # room for one: the unread b goes
    assert finished(tier, 1)[0].success
    assert cycle(tier, [a, b, c], ReqContext("r")) == [HIT, MISS, HIT]
    # The mirror's answers are the library's.
    assert [tier._tier.lookup_one(k).name for k in (a, b, c)] == ["HIT", "MISS", "HIT"]


def test_read_block_outlives_unread_one_in_a_real_manager():
    """vLLM promotes a block from kvtier: that read keeps it over a block
    stored later but never read."""
    t = primary_and_manager(
        {"type": "KVTierSecondaryTier", "module_path": "kvtier.vllm",
         "capacity_bytes": 3 * 64 * 1024, "io_threads": 2},
        rows=2,
    )
    try:
        a, b, c, d = keys(1, 2, 3, 4)
        for req, k in (("A", a), ("B", b), ("C", c)):
            t.store(req, [k])  # the primary (2 rows) drops a; kvtier holds a, b, c
        ctx = ReqContext("R")
        with t.manager.lock:
            t.manager.on_new_request(ctx)
            assert t.manager.lookup(a, ctx) is LookupResult.HIT_PENDING  # from kvtier
        t.steps()
        with t.manager.lock:
            assert t.manager.lookup(a, ctx) is HIT
            t.manager.prepare_load([a], ctx)
            t.manager.complete_load([a], ctx)
            t.manager.on_request_finished(ctx)
        assert t.tier.stats().loads_ok == 1
        t.store("D", [d])  # kvtier is full: the oldest unread block (b) goes, not a
        assert [t.tier.lookup(k, ReqContext("x")) for k in (a, b, c, d)] == [HIT, MISS, HIT, HIT]
        assert t.tier.stats().evictions == 1
    finally:
        t.data = None
        t.manager.shutdown()


def test_transfer_bytes_count_every_key_of_the_job(make):
    """vLLM's backpressure detector and byte counters take a job's size as
    len(keys) x row bytes (its fs tier reports that); the library's own count
    skips blocks already present."""
    tier, _ = make(rows=8)
    tier.submit_store(job(1, keys(1, 2), [0, 1]))
    [r] = finished(tier, 1)
    assert r.transfer_bytes == 2 * ROW
    tier.submit_store(job(2, keys(1, 2, 3), [0, 1, 2]))  # two already present
    [r] = finished(tier, 1)
    assert r.success and r.transfer_bytes == 3 * ROW
    assert tier.stats().bytes_stored == 3 * ROW  # the library copied only three rows in all
    tier.submit_load(job(3, keys(1, 2, 3), [5, 6, 7], load=True))
    [r] = finished(tier, 1)
    assert r.success and r.transfer_bytes == 3 * ROW


def test_backpressure_detector_gets_len_keys_times_row_bytes():
    from vllm.v1.kv_offload.tiering.backpressure import EMABackpressureDetector

    t = primary_and_manager(
        {"type": "KVTierSecondaryTier", "module_path": "kvtier.vllm", "capacity_bytes": "1MiB",
         "io_threads": 2, "backpressure": {"backpressure_cls": "EMABackpressureDetector"}},
    )
    try:
        detector = t.tier.bp_detector
        assert isinstance(detector, EMABackpressureDetector)
        seen = []
        real_update = detector.update
        detector.update = lambda submit_time, num_bytes: (seen.append(num_bytes), real_update(submit_time, num_bytes))
        t.store("A", keys(1, 2))
        # The primary evicts nothing, so this cascade names all three keys;
        # kvtier already holds two of them.
        t.store("B", keys(1, 2, 3))
        assert seen == [2 * 64 * 1024, 3 * 64 * 1024]
    finally:
        t.data = None
        t.manager.shutdown()


def test_transfer_time_is_the_jobs_io_time_not_its_queueing(make, monkeypatch):
    tier, _ = make()
    tier.submit_store(job(1, keys(1), [0]))
    tier.drain_jobs()
    real_poll = tier._tier.poll
    # The real result, as a job that waited 0.9 s in the queue and copied for 0.123 s.
    monkeypatch.setattr(
        tier._tier,
        "poll",
        lambda max=1024: [r._replace(elapsed_ns=900_000_000, io_ns=123_000_000) for r in real_poll(max)],
    )
    [r] = tier.get_finished_jobs()
    assert r.transfer_time == pytest.approx(0.123)


def test_get_finished_jobs_between_jobs_calls_no_library_poll(make, monkeypatch):
    """An engine asks every step, far more often than jobs end: on a private
    tier with a complete mirror, results waiting show on the completion fd
    and every event comes with a result, so asking between jobs costs no
    library call, and what the jobs did still reaches the mirror."""
    tier, _ = make()
    calls = []
    for name in ("poll", "poll_events"):
        real = getattr(tier._tier, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            calls.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(tier._tier, name, counted)
    tier.submit_store(job(1, keys(1, 2), [0, 1]))
    tier.drain_jobs()
    [r] = tier.get_finished_jobs()
    assert r.success and calls.count("poll") >= 1 and "poll_events" in calls
    calls.clear()
    for _ in range(5):
        assert tier.get_finished_jobs() == []
    assert calls == []
    assert cycle(tier, keys(1, 2, 3), ReqContext("r")) == [HIT, HIT, MISS]
    assert calls == []  # answered by the mirror


def test_without_a_completion_fd_every_call_polls(make, monkeypatch, caplog):
    """No descriptor left for the completion fd (EMFILE): the adapter still
    builds, logs it, and finds results by polling on every call."""

    def no_fd(self):
        raise kvtier.KVTierError(kvtier._lib.TIER_ERR_IO, "eventfd: Too many open files", "tier_completion_fd")

    monkeypatch.setattr(kvtier.Tier, "completion_fd", no_fd)
    tier, _ = make()
    assert "completion_fd" in caplog.text
    tier.submit_store(job(1, keys(1), [0]))
    tier.drain_jobs()
    [r] = tier.get_finished_jobs()
    assert r.success


def test_enable_kv_events_is_parsed_strictly(make):
    on = spec(events=True)
    for value in ("false", "False", "0", "off", False, 0):
        tier, _ = make(offloading_spec=on, enable_kv_events=value)
        assert tier._events is None, value
    for value in ("true", "TRUE", "1", "yes", True, 1):
        tier, _ = make(offloading_spec=on, enable_kv_events=value)
        assert tier._events == [], value
    for value in ("maybe", "", 2, None, "fals"):
        with pytest.raises(ValueError, match="enable_kv_events must be true or false"):
            make(offloading_spec=on, enable_kv_events=value)
    with pytest.raises(ValueError, match="lookup_mirror"):
        make(lookup_mirror="nope")
    with pytest.raises(ValueError, match="'events' is set by the adapter"):
        make(events=True)


@pytest.mark.parametrize("name", ["memory", "Memory", "MEMORY", " memory "])
def test_memory_backend_name_in_any_case(make, name):
    tier, _ = make(backend=name)
    assert (tier.medium, tier.cache_hit_source, tier.locality) == (
        Medium.CPU, CacheHitSource.HOST, Locality.LOCAL,
    )
    assert tier.config_info()["kvtier_backend"] == "memory"


@pytest.mark.parametrize("name", ["disk", "Disk", "DISK"])
def test_disk_backend_is_storage(make, tmp_path, name):
    tier, _ = make(backend=name, path=str(tmp_path / "kv"))
    assert (tier.medium, tier.cache_hit_source, tier.locality) == (
        Medium.STORAGE, CacheHitSource.DISK, Locality.LOCAL,
    )
    # A shared store needs a namespace (this spec has no config to derive one from).
    shared, _ = make(backend=name, path=str(tmp_path / "kv2"), shared="True", namespace="t")
    assert shared.locality is None  # a shared directory may be remote: say it in config
    configured, _ = make(backend=name, path=str(tmp_path / "kv3"), shared=True, locality="REMOTE", namespace="t")
    assert configured.locality is Locality.REMOTE


def test_bad_backend_name_is_a_config_error(make):
    with pytest.raises(kvtier.KVTierError, match="unknown backend"):
        make(backend="tape")


def test_storage_backends_get_storage_backpressure_defaults(tmp_path):
    from vllm.v1.kv_offload.tiering.backpressure import EMABackpressureDetector as EMA

    def detector(**cfg):
        config = {"type": "KVTierSecondaryTier", "module_path": "kvtier.vllm", "capacity_bytes": "1MiB",
                  "backpressure": {"backpressure_cls": "EMABackpressureDetector"}, **cfg}
        arr = np.zeros((4, ROW), dtype=np.int8)
        tier = SecondaryTierFactory.create_secondary_tier(config, memoryview(arr), spec())
        tier.shutdown()
        d = tier.bp_detector
        return d._failure_threshold, d._high, d._low

    # What vLLM's fs tier gets: local water marks and a failure threshold.
    assert detector(backend="Disk", path=str(tmp_path / "a")) == (
        EMA.DEFAULT_FAILURE_THRESHOLD, EMA.LOCAL_HIGH_WATER_S, EMA.LOCAL_LOW_WATER_S,
    )
    # An explicit choice stays.
    explicit = {"backpressure_cls": "EMABackpressureDetector", "failure_threshold": 7,
                "high_water_s": 1.0, "low_water_s": 0.5}
    assert detector(backend="disk", path=str(tmp_path / "b"), backpressure=explicit) == (7, 1.0, 0.5)
    # Memory stores fail per job (no room while blocks are pinned), not as a
    # sign of a sick device: no failure threshold, as vLLM's CPU tiers.
    assert detector() == (None, EMA.LOCAL_HIGH_WATER_S, EMA.LOCAL_LOW_WATER_S)


def test_vllm_prometheus_registry_exposes_kvtier_series():
    import functools

    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
    from prometheus_client.parser import text_string_to_metric_families
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadPromMetrics

    tier_config = {"type": "KVTierSecondaryTier", "module_path": "kvtier.vllm",
                   "capacity_bytes": 2 * 64 * 1024, "io_threads": 2}
    extra = {"spec_name": "TieringOffloadingSpec", "secondary_tiers": [dict(tier_config)]}
    registry = CollectorRegistry()
    prom = OffloadPromMetrics(
        SimpleNamespace(kv_transfer_config=SimpleNamespace(kv_connector_extra_config=extra)),
        {cls: functools.partial(cls, registry=registry) for cls in (Gauge, Counter, Histogram)},
        ["model_name", "engine"],
        {0: ["m", "0"]},
    )
    t = primary_and_manager(tier_config)
    try:
        t.store("A", keys(1, 2))
        t.store("B", keys(3, 4))  # kvtier holds two rows: evicts 1 and 2
        assert t.tier.lookup(to_key(3), ReqContext("x")) is HIT
        stats = t.manager.get_stats()
        stats.set_info(t.manager.config_info())  # the scheduler sends it once
        prom.observe(stats.data, 0)
    finally:
        t.data = None
        t.manager.shutdown()

    samples = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            if s.name.startswith("vllm:kv_offload_kvtier_") or s.name == "vllm:kv_offload_config_info":
                samples.setdefault(s.name, []).append((s.labels, s.value))

    def value(name, **labels):
        [(got_labels, v)] = [
            (lab, v) for lab, v in samples[name] if all(lab.get(k) == w for k, w in labels.items())
        ]
        assert got_labels["tier_type"] == "KVTierSecondaryTier" and got_labels["backend"] == "memory"
        return v

    assert value("vllm:kv_offload_kvtier_capacity_bytes") == 2 * 64 * 1024
    assert value("vllm:kv_offload_kvtier_used_bytes") == 2 * 64 * 1024
    assert value("vllm:kv_offload_kvtier_blocks") == 2
    assert value("vllm:kv_offload_kvtier_evictions_total") == 2
    assert value("vllm:kv_offload_kvtier_store_jobs_ok_total") == 2
    assert value("vllm:kv_offload_kvtier_stored_bytes_total") == 4 * 64 * 1024
    assert value("vllm:kv_offload_kvtier_lookup_hits_total", source="mirror") == 1
    assert value("vllm:kv_offload_kvtier_lookups_total", source="library") == 0
    [info] = [lab for lab, _ in samples["vllm:kv_offload_config_info"] if lab.get("tier", "").endswith("KVTierSecondaryTier")]
    assert (info["kvtier_backend"], info["kvtier_capacity_bytes"], info["kvtier_block_bytes"]) == (
        "memory", str(2 * 64 * 1024), str(64 * 1024),
    )


def test_get_stats_counters_are_increases_since_the_last_call(make):
    tier, _ = make(rows=4, capacity_bytes=ROW)
    tier.submit_store(job(1, keys(1), [0]))
    finished(tier, 1)
    tier.submit_store(job(2, keys(2), [1]))  # evicts key 1
    finished(tier, 1)
    labels = ("KVTierSecondaryTier", "memory")
    data = tier.get_stats().data["data"]
    assert data["vllm:kv_offload_kvtier_evictions"] == {labels: 1}
    assert data["vllm:kv_offload_kvtier_blocks"] == {labels: 1}
    again = tier.get_stats().data["data"]
    assert again["vllm:kv_offload_kvtier_evictions"] == {labels: 0}
    assert again["vllm:kv_offload_kvtier_blocks"] == {labels: 1}  # a gauge stays
    tier.shutdown()
    assert tier.get_stats() is None


# -- the presence mirror -------------------------------------------------------------


def library_answer(tier, key):
    return {"HIT": HIT, "MISS": MISS, "PENDING": RETRY}[tier._tier.lookup_one(key).name]


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_mirror_answers_as_the_library_under_eviction(make, seed):
    """A vLLM-shaped run: each step polls results, looks keys up, loads this
    step's HITs and ends the step; stores (which evict: the tier is far
    smaller than the key space) come after the step's end, as vLLM's
    cascades, or, in half the steps, between the poll and the lookups. Jobs
    stay in flight across steps. Every answer equals the library's at that
    moment, and no load of a mirrored HIT fails."""
    rng = np.random.default_rng(seed)
    rows, capacity_rows, universe = 64, 12, 40
    tier, arr = make(rows=rows, capacity_bytes=capacity_rows * ROW, io_threads=2)
    next_job = iter(range(1, 10**6))
    loads = {}
    answered = 0

    def store():
        n = int(rng.integers(1, 6))
        ks = keys(*rng.choice(universe, size=n, replace=False))
        tier.submit_store(job(next(next_job), ks, list(range(n))))

    for step in range(300):
        for r in tier.get_finished_jobs():
            if r.job_id in loads:
                assert r.success, (r, loads[r.job_id])
                del loads[r.job_id]
        store_first = rng.random() < 0.5
        if store_first:
            store()
        ctx = ReqContext(f"req{step}")
        hits = []
        for k in keys(*rng.choice(universe, size=6, replace=False)):
            got = tier.lookup(k, ctx)
            expected = library_answer(tier, k)
            # A store in flight may finish between the two calls.
            assert got is expected or (got, expected) == (RETRY, HIT), (step, k, got, expected)
            answered += 1
            if got is HIT:
                hits.append(k)
        if hits:
            j = next(next_job)
            loads[j] = hits
            tier.submit_load(job(j, hits, list(range(32, 32 + len(hits))), load=True, ctx=ctx))
        tier.on_schedule_end(ScheduleEndContext(new_req_ids=(), preempted_req_ids=()))
        if not store_first:
            store()
    tier.drain_jobs()
    for r in tier.get_finished_jobs():
        if r.job_id in loads:
            assert r.success, r
            del loads[r.job_id]
    assert loads == {}
    m = tier.stats_mirror()
    assert m["complete"] and m["mirror_hit_failed_loads"] == 0
    assert tier.stats().evictions > 20  # the run did evict
    assert m["mirror_lookups"] > answered // 2  # most answers came from the mirror
    # Whole: the mirror holds exactly the library's readable blocks.
    assert m["keys"] == tier.stats().num_blocks
    assert all(library_answer(tier, k) is HIT for k in tier._mirror.present)


def test_lost_events_fall_back_to_the_library_then_resync(make):
    tier, _ = make(rows=32, capacity_bytes="1MiB", events_capacity=4)
    ks = keys(*range(16))
    tier.submit_store(job(1, ks, list(range(16))))  # 16 STORED events, ring of 4
    finished(tier, 1)
    m = tier.stats_mirror()
    assert not m["complete"] and tier.stats().events_dropped > 0
    ctx = ReqContext("r")
    absent = to_key(999)
    assert [tier.lookup(k, ctx) for k in ks] == [HIT] * 16  # from the library
    assert tier.lookup(absent, ctx) is MISS
    asked = tier.stats_mirror()["library_lookups"]
    assert asked >= 16 - m["keys"]
    tier.get_finished_jobs()  # nothing in flight, 16 blocks, 16 keys: whole again
    assert tier.stats_mirror()["complete"]
    assert [tier.lookup(k, ctx) for k in ks] == [HIT] * 16
    assert tier.lookup(absent, ctx) is MISS
    assert tier.stats_mirror()["library_lookups"] == asked  # all from the mirror now


def test_unsettled_keys_are_asked_of_the_library(make):
    arr = np.zeros((64, 1 << 20), dtype=np.int8)
    tier, _ = make(arr=arr, capacity_bytes="128MiB", io_threads=1)
    ks = keys(*range(64))
    tier.submit_store(job(1, ks, list(range(64))))
    before = tier.stats_mirror()["library_lookups"]
    assert tier.lookup(ks[-1], ReqContext("r")) in (RETRY, HIT)
    assert tier.stats_mirror()["library_lookups"] == before + 1
    finished(tier, 1)
    assert tier.lookup(ks[-1], ReqContext("r")) is HIT
    assert tier.stats_mirror()["library_lookups"] == before + 1  # settled: the mirror answers


def test_mirrored_hit_survives_a_store_before_its_load(make):
    """A store submitted between a lookup's HIT and its load (not vLLM's
    order, but allowed) evicts other blocks first: the HIT key is touched."""
    tier, _ = make(rows=8, capacity_bytes=3 * ROW)
    a, b, c, d = keys(1, 2, 3, 4)
    tier.submit_store(job(1, [c, b, a], [2, 1, 0]))  # a least recent
    finished(tier, 1)
    ctx = ReqContext("r")
    assert tier.lookup(a, ctx) is HIT
    tier.submit_store(job(2, [d], [3]))  # needs one slot
    finished(tier, 1)
    tier.submit_load(job(3, [a], [6], load=True, ctx=ctx))
    [r] = finished(tier, 1)
    assert r.success and tier.stats_mirror()["mirror_hit_failed_loads"] == 0
    assert cycle(tier, [a, b, c, d], ReqContext("x")) == [HIT, MISS, HIT, HIT]


def test_shared_disk_mirror_knows_only_what_it_has_seen(make, tmp_path):
    root = str(tmp_path / "shared")
    writer, warr = make(rows=8, backend="disk", path=root, shared=True, probe_ttl_ms=0, namespace="t")
    reader, _ = make(rows=8, backend="disk", path=root, shared=True, probe_ttl_ms=0, namespace="t")
    fill(warr, [0, 1])
    ks = keys(1, 2)
    writer.submit_store(job(1, ks, [0, 1]))
    finished(writer, 1)
    ctx = ReqContext("r")
    deadline = time.monotonic() + 10
    while [reader.lookup(k, ctx) for k in ks] != [HIT, HIT]:  # probes find them
        assert time.monotonic() < deadline
        reader.get_finished_jobs()
        time.sleep(0.01)
    assert not reader.stats_mirror()["complete"]  # another writer: never whole
    assert reader.lookup(to_key(3), ctx) in (MISS, RETRY)  # asked of the library
    reader.submit_load(job(2, ks, [6, 7], load=True, ctx=ctx))
    [r] = finished(reader, 1)
    assert r.success


def test_redis_backend_is_a_remote_store_with_network_backpressure(redis_url):
    from vllm.v1.kv_offload.tiering.backpressure import EMABackpressureDetector as EMA

    def build(**cfg):
        config = {"type": "KVTierSecondaryTier", "module_path": "kvtier.vllm", "capacity_bytes": "1MiB",
                  "url": redis_url, "key_prefix": f"t{time.monotonic_ns()}",
                  "backpressure": {"backpressure_cls": "EMABackpressureDetector"}, **cfg}
        arr = np.zeros((4, ROW), dtype=np.int8)
        tier = SecondaryTierFactory.create_secondary_tier(config, memoryview(arr), spec())
        tier.shutdown()
        d = tier.bp_detector
        return tier, (d._failure_threshold, d._high, d._low)

    for name in ("redis", "Redis", "VALKEY"):
        tier, bp = build(backend=name)
        assert (tier.medium, tier.cache_hit_source, tier.locality) == (
            Medium.STORAGE, CacheHitSource.EXTERNAL_UNSPECIFIED, Locality.REMOTE,
        )
        # What vLLM gives its network storage ("obj"): network water marks
        # and a failure threshold.
        assert bp == (EMA.DEFAULT_FAILURE_THRESHOLD, EMA.NETWORK_HIGH_WATER_S, EMA.NETWORK_LOW_WATER_S)
        assert tier._backend == "redis"
    # A server on this host, said so: local water marks (the factory's).
    tier, bp = build(backend="redis", locality="LOCAL")
    assert tier.locality is Locality.LOCAL
    assert bp == (EMA.DEFAULT_FAILURE_THRESHOLD, EMA.LOCAL_HIGH_WATER_S, EMA.LOCAL_LOW_WATER_S)
    tier, _ = build(backend="redis", sharing="Shared", namespace="t")
    assert tier._shared and not tier.stats_mirror()["complete"]
    # As the library and the SGLang adapter read it (it trims the value).
    tier, _ = build(backend="redis", sharing=" shared", namespace="t")
    assert tier._shared and not tier.stats_mirror()["complete"]


def test_disk_blocks_recovered_at_open_are_in_the_mirror_and_announced(make, tmp_path):
    root = str(tmp_path / "kv")
    first, arr = make(rows=8, backend="disk", path=root)
    fill(arr, [0, 1, 2])
    ks = keys(1, 2, 3)
    first.submit_store(job(1, ks, [0, 1, 2]))
    finished(first, 1)
    first.shutdown()
    again, arr2 = make(rows=8, backend="disk", path=root, offloading_spec=spec(events=True), enable_kv_events=True)
    m = again.stats_mirror()
    assert m["complete"] and m["keys"] == 3  # the open's RECOVERED events
    ctx = ReqContext("r")
    assert [again.lookup(k, ctx) for k in ks + keys(4)] == [HIT, HIT, HIT, MISS]
    assert again.stats_mirror()["library_lookups"] == 0
    stored, removed = removed_and_stored(again.take_events())
    assert (sorted(stored), removed) == (sorted(ks), [])
    again.submit_load(job(2, ks, [5, 6, 7], load=True, ctx=ctx))
    [r] = finished(again, 1)
    assert r.success and arr2[5:8].tobytes() == arr[0:3].tobytes()
