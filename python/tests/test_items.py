"""Extent stores and loads, deletes and pins through the binding (issue 59):
the Python surface the LMCache adapter codes against."""

from __future__ import annotations

import os
import shutil
import threading

import numpy as np
import pytest

import kvtier
from kvtier import FailReason, ItemResult, ItemStatus, JobKind, KVTierError, LookupState, Tier

BLOCK = 8192


def key(i: int) -> bytes:
    return i.to_bytes(8, "big").rjust(32, b"x")


def pattern(i: int, n: int) -> np.ndarray:
    return ((np.arange(n, dtype=np.uint64) * 131 + i * 7919) % 251).astype(np.uint8)


def make(blocks: int = 32, **cfg):
    cfg.setdefault("capacity_bytes", blocks * BLOCK)
    cfg.setdefault("io_threads", 2)
    buf = np.zeros(16 * BLOCK, dtype=np.uint8)
    return buf, Tier(buf, block_bytes=BLOCK, **cfg)


def result_of(tier: Tier, job_id: int) -> kvtier.JobResult:
    assert tier.wait(10.0)
    [r] = tier.poll()
    assert r.job_id == job_id
    return r


OK = ItemResult(ItemStatus.OK, FailReason.NONE)


@pytest.mark.parametrize("backend", ["memory", "disk", "persist"])
def test_unaligned_extents_round_trip_with_per_item_results(backend, tmp_path):
    cfg = {
        "memory": {},
        "disk": {"backend": "disk", "path": str(tmp_path), "o_direct": "on"},
        "persist": {"persist_path": f"/dev/shm/kvtier-items-{os.getpid()}", "namespace": "items"},
    }[backend]
    try:
        _round_trip(*make(**cfg))
    finally:
        shutil.rmtree(f"/dev/shm/kvtier-items-{os.getpid()}", ignore_errors=True)


def _round_trip(buf: np.ndarray, tier: Tier) -> None:
    with tier:
        src = [(1, 1), (13, 4095), (5000, BLOCK), (20001, 777)]
        dst = [(100001, 1), (90000, 4095), (7, BLOCK), (60123, 777)]
        for i, (off, n) in enumerate(src):
            buf[off : off + n] = pattern(i, n)
        keys = [key(i) for i in range(4)]
        tier.submit_store_extents(1, keys, [o for o, _ in src], [n for _, n in src])
        r = result_of(tier, 1)
        assert (r.ok, r.kind, r.items) == (True, JobKind.STORE, [OK] * 4)
        buf[:] = 0
        tier.submit_load_extents(2, keys, np.array([o for o, _ in dst]), np.array([n for _, n in dst]))
        r = result_of(tier, 2)
        assert (r.ok, r.num_done, r.items) == (True, 4, [OK] * 4)
        for i, (off, n) in enumerate(dst):
            assert np.array_equal(buf[off : off + n], pattern(i, n)), i
        assert isinstance(r.items[0].status, ItemStatus) and r.items[0].ok


SEAL_KEY = "a1" * 32


@pytest.mark.parametrize(
    "backend, features",
    [
        ("memory", kvtier.Feature.EXTENTS),
        ("persist", kvtier.Feature.EXTENTS | kvtier.Feature.PERSISTENT),
        ("disk", kvtier.Feature.EXTENTS | kvtier.Feature.PERSISTENT),
        ("shared disk", kvtier.Feature.EXTENTS | kvtier.Feature.SHARED | kvtier.Feature.PERSISTENT),
        ("sealed disk", kvtier.Feature.SEALED | kvtier.Feature.PERSISTENT),
        ("redis", kvtier.Feature.EXTENTS | kvtier.Feature.PERSISTENT),
        ("sealed shared redis", kvtier.Feature.SHARED | kvtier.Feature.SEALED | kvtier.Feature.PERSISTENT),
    ],
)
def test_features_say_what_the_tier_takes(request, backend, features, tmp_path):
    """Tier.features() is the library's answer (tier_features); its EXTENTS
    is what an extent store then finds."""
    shm = f"/dev/shm/kvtier-features-{os.getpid()}"
    disk = {"backend": "disk", "path": str(tmp_path), "namespace": "f"}
    cfg = {
        "memory": {},
        "persist": {"persist_path": shm, "namespace": "f"},
        "disk": disk,
        "shared disk": {**disk, "shared": True},
        "sealed disk": {**disk, "seal_key": SEAL_KEY},
    }.get(backend)
    if cfg is None:
        url = request.getfixturevalue("redis_url")
        cfg = {"backend": "redis", "url": url, "key_prefix": f"features-{backend}-{os.getpid()}"}
        if backend.startswith("sealed"):
            cfg.update(seal_key=SEAL_KEY, sharing="shared", namespace="f")
    try:
        buf, tier = make(**cfg)
        with tier:
            assert tier.features() == features
            assert isinstance(tier.features(), kvtier.Feature)
            if kvtier.Feature.EXTENTS in features:
                tier.submit_store_extents(1, [key(1)], [3], [100])
                assert result_of(tier, 1).ok
            else:
                with pytest.raises(KVTierError) as err:
                    tier.submit_store_extents(1, [key(1)], [3], [100])
                assert err.value.status == kvtier.TIER_ERR_INVALID_ARG
        with pytest.raises(KVTierError):
            tier.features()  # closed
    finally:
        shutil.rmtree(shm, ignore_errors=True)


def test_a_partial_load_says_which_keys_loaded():
    buf, tier = make()
    with tier:
        tier.submit_store_extents(1, [key(1), key(2)], [0, BLOCK], [100, 200])
        assert result_of(tier, 1).ok
        tier.submit_load_extents(2, [key(1), key(9), key(2)], [50000, 60000, 70000], [101, 10, 200])
        r = result_of(tier, 2)
        assert not r.ok and r.num_done == 1
        assert r.items == [
            ItemResult(ItemStatus.FAILED, FailReason.LENGTH_MISMATCH),
            ItemResult(ItemStatus.MISS, FailReason.NOT_FOUND),
            OK,
        ]
        assert not buf[50000:50101].any(), "nothing copied for a length mismatch"


def test_extents_outside_the_buffer_are_refused_and_nothing_queued():
    buf, tier = make()
    with tier:
        for offsets, lengths in ([len(buf) - 10], [11]), ([0], [0]), ([0], [BLOCK + 1]), ([-1], [1]):
            with pytest.raises(KVTierError) as e:
                tier.submit_store_extents(3, [key(1)], offsets, lengths)
            assert e.value.status == kvtier.TIER_ERR_INVALID_ARG
        with pytest.raises(KVTierError):
            tier.submit_load_extents(3, [key(1), key(2)], [0], [1, 2])
        tier.drain()
        assert tier.poll() == []
        # The job id stayed free.
        tier.submit_store_extents(3, [key(1)], [len(buf) - 10], [10])
        assert result_of(tier, 3).items == [OK]


def test_delete_pins_and_unpin():
    buf, tier = make(events=True)
    with tier:
        tier.submit_store_extents(1, [key(1), key(2)], [0, BLOCK], [10, 20])
        assert result_of(tier, 1).ok
        tier.poll_events()
        assert tier.pin([key(2), key(5)]) == [LookupState.HIT, LookupState.MISS]
        tier.submit_delete(2, [key(1), key(7), key(2)])
        r = result_of(tier, 2)
        assert (r.ok, r.kind, r.num_done) == (True, JobKind.DELETE, 1)
        assert r.items == [
            OK,
            ItemResult(ItemStatus.MISS, FailReason.NOT_FOUND),
            ItemResult(ItemStatus.BUSY, FailReason.BUSY),
        ]
        [event] = tier.poll_events()
        assert (event.kind, event.reason, event.key) == (
            kvtier.EventKind.REMOVED,
            kvtier.RemovedReason.DELETED,
            key(1),
        )
        tier.unpin([key(2), key(2), key(99)])  # more than pinned, and unknown
        tier.submit_delete(3, [key(2)])
        assert result_of(tier, 3).items == [OK]
        assert tier.lookup([key(1), key(2)]) == [LookupState.MISS] * 2
    tier.unpin([key(1)])  # closed: does nothing
    with pytest.raises(KVTierError):
        tier.pin([key(1)])


def test_pins_hold_off_eviction():
    buf, tier = make(blocks=2)
    with tier:
        tier.submit_store_extents(1, [key(1), key(2)], [0, BLOCK], [10, 20])
        assert result_of(tier, 1).ok
        tier.pin([key(1), key(2)])
        tier.submit_store_extents(2, [key(3)], [2 * BLOCK], [30])
        r = result_of(tier, 2)
        assert r.items == [ItemResult(ItemStatus.FAILED, FailReason.NO_SPACE)]
        tier.unpin([key(1)])
        tier.submit_store_extents(3, [key(3)], [2 * BLOCK], [30])
        assert result_of(tier, 3).ok
        assert tier.lookup([key(1), key(2), key(3)]) == [LookupState.MISS, LookupState.HIT, LookupState.HIT]


def test_submits_from_threads_each_get_their_items():
    buf, tier = make(blocks=64)
    with tier:
        def worker(t: int) -> None:
            for j in range(20):
                job = t * 1000 + j
                k = key(job)
                tier.submit_store_extents(job, [k], [t * 4 * BLOCK + j * 100], [100])

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(2)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        tier.drain()
        results = tier.poll()
        assert len(results) == 40
        assert all(r.items == [OK] for r in results)
        with pytest.raises(KVTierError) as e:
            tier.submit_delete(5, [key(1)])
            tier.submit_delete(5, [key(1)])
        assert e.value.status == kvtier.TIER_ERR_DUPLICATE_JOB
