"""The ctypes binding: round trips, every error as KVTierError, lifetime, threads.

Needs only pytest and numpy (one test also runs without numpy, in a subprocess).
"""

from __future__ import annotations

import gc
import mmap
import multiprocessing
import os
import pickle
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path

import numpy as np
import pytest
from child import child_env

import kvtier
from kvtier import KVTierError, LookupState, Tier

ROW = 4096
PYTHON_DIR = Path(__file__).resolve().parent.parent


def key(i: int, length: int = 36) -> bytes:
    return i.to_bytes(8, "big").rjust(length, b"k")


def make(rows: int = 16, row: int = ROW, **cfg):
    cfg.setdefault("capacity_bytes", "1MiB")
    cfg.setdefault("io_threads", 2)
    buf = np.zeros((rows, row), dtype=np.uint8)
    return buf, Tier(buf, **cfg)


def fill(buf: np.ndarray, rows) -> None:
    rng = np.random.default_rng(1234)
    for r in rows:
        buf[r] = rng.integers(0, 256, size=buf.shape[1], dtype=np.uint8)


def results(tier: Tier, count: int, timeout: float = 5.0):
    """Polls until `count` results arrived (fails on a timeout or an extra one)."""
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < count:
        assert time.monotonic() < deadline, f"only {len(got)} of {count} results"
        tier.wait(0.05)
        got.extend(tier.poll())
    tier.drain()  # anything still running would be an extra result
    got.extend(tier.poll())
    assert len(got) == count, got
    return got


def raises(status: int, fn, *args, **kwargs) -> KVTierError:
    with pytest.raises(KVTierError) as info:
        fn(*args, **kwargs)
    err = info.value
    assert err.status == status, err
    assert err.status_name == kvtier.status_name(status)
    assert err.message
    assert err.status_name in str(err)
    return err


# -- loading -------------------------------------------------------------------


def test_library_loaded_and_versioned():
    assert kvtier.library_path.is_file()
    assert kvtier.library_version().count(".") == 2
    assert kvtier.status_name(kvtier.TIER_ERR_NO_SPACE) == "TIER_ERR_NO_SPACE"
    assert kvtier.status_name(12345) == "TIER_UNKNOWN_STATUS"


def test_missing_library_is_a_clear_import_error(tmp_path):
    env = child_env(KVTIER_LIBRARY=str(tmp_path / "nope.so"))
    proc = subprocess.run(
        [sys.executable, "-c", "import kvtier"], env=env, capture_output=True, text=True
    )
    assert proc.returncode != 0
    assert "LibraryNotFoundError" in proc.stderr
    assert str(tmp_path / "nope.so") in proc.stderr
    assert "KVTIER_LIBRARY" in proc.stderr


# -- round trips --------------------------------------------------------------


@pytest.mark.parametrize("n", [0, 1, 2, 5])
def test_numpy_round_trip(n):
    buf, tier = make(rows=12)
    with tier:
        fill(buf, range(n))
        keys = [key(i) for i in range(n)]
        tier.submit_store(1, keys, np.arange(n))
        [r] = results(tier, 1)
        assert (r.job_id, r.ok, r.kind, r.num_blocks, r.num_done) == (1, True, kvtier.JobKind.STORE, n, n)
        assert r.bytes == n * ROW and r.is_store
        assert tier.lookup(keys) == [LookupState.HIT] * n
        dest = np.arange(12 - n, 12)
        tier.submit_load(2, keys, dest)
        [r] = results(tier, 1)
        assert (r.job_id, r.ok, r.is_load, r.num_done, r.bytes) == (2, True, True, n, n * ROW)
        for i in range(n):
            assert np.array_equal(buf[dest[i]], buf[i])


def test_bytearray_round_trip_with_explicit_rows():
    buf = bytearray(8 * 1024)
    buf[0:1024] = bytes(range(256)) * 4
    with Tier(buf, block_bytes=1024, capacity_bytes=64 * 1024, io_threads=1) as tier:
        assert tier.num_rows == 8
        tier.submit_store(7, [b"abc"], [0])
        assert results(tier, 1)[0].ok
        tier.submit_load(8, (b"abc",), (5,))
        assert results(tier, 1)[0].ok
        assert buf[5 * 1024 : 6 * 1024] == buf[0:1024]


def test_mmap_and_float32_views():
    mm = mmap.mmap(-1, 8 * ROW)
    with Tier(mm, block_bytes=ROW, capacity_bytes=ROW * 8) as tier:
        mm[0:ROW] = b"\x5a" * ROW
        tier.submit_store(1, [key(1)], [0])
        tier.submit_load(2, [key(1)], [3])
        assert all(r.ok for r in results(tier, 2))
        assert mm[3 * ROW : 4 * ROW] == b"\x5a" * ROW
    mm.close()  # the tier released its export

    arr = np.zeros((4, 1024), dtype=np.float32)  # rows of 4096 bytes, strides (4096, 4)
    with Tier(memoryview(arr), capacity_bytes="64KiB") as tier:
        assert tier.block_bytes == 4096 and tier.num_rows == 4
        arr[1] = np.linspace(0, 1, 1024, dtype=np.float32)
        tier.submit_store(1, [key(1)], [1])
        tier.submit_load(2, [key(1)], [2])
        assert all(r.ok for r in results(tier, 2))
        assert np.array_equal(arr[2], arr[1])


def test_default_block_bytes_is_first_stride():
    _, tier = make(rows=4, row=8192)
    with tier:
        assert tier.block_bytes == 8192 and tier.num_rows == 4
    with Tier(bytearray(64), capacity_bytes=64) as tier:
        assert tier.block_bytes == 1  # a 1-D buffer's stride: pass block_bytes


def test_lookup_order_touch_and_lru():
    buf, tier = make(rows=4, capacity_bytes=2 * ROW)
    with tier:
        a, b, c = key(1), key(2), key(3)
        tier.submit_store(1, [a, b], [0, 1])
        results(tier, 1)
        assert tier.lookup([c, a, c, b]) == [LookupState.MISS, LookupState.HIT, LookupState.MISS, LookupState.HIT]
        assert tier.lookup_one(a) is LookupState.HIT
        assert tier.lookup([]) == []
        # [a, b] stores a most recent; touching b makes a the LRU victim.
        tier.touch([b])
        tier.touch([])
        tier.submit_store(2, [c], [2])
        assert results(tier, 1)[0].ok
        assert tier.lookup([a, b, c]) == [LookupState.MISS, LookupState.HIT, LookupState.HIT]
        s = tier.stats()
        assert s.evictions == 1 and s.num_blocks == 2 and s.capacity_blocks == 2


def test_a_load_counts_as_use():
    buf, tier = make(rows=4, capacity_bytes=2 * ROW)
    with tier:
        a, b, c = key(1), key(2), key(3)
        tier.submit_store(1, [a, b], [0, 1])
        results(tier, 1)
        # [a, b] stores a most recent; reading b makes a the LRU victim.
        tier.submit_load(2, [b], [3])
        assert results(tier, 1)[0].ok
        tier.submit_store(3, [c], [2])
        assert results(tier, 1)[0].ok
        assert tier.lookup([a, b, c]) == [LookupState.MISS, LookupState.HIT, LookupState.HIT]


def test_events_report_stores_evictions_clears_and_losses():
    from kvtier import Event, EventKind, RemovedReason, StoredReason

    buf, tier = make(rows=4, capacity_bytes=2 * ROW, events=True, events_capacity=3)
    with tier:
        a, b, c = key(1), key(2), key(3)
        tier.submit_store(1, [a, b], [0, 1])
        results(tier, 1)
        tier.submit_store(2, [c], [2])  # evicts b, the least recent
        results(tier, 1)
        got = tier.poll_events()
        # The ring holds 3: the oldest event was dropped, and that is said in
        # its place.
        assert got[0] == Event(0, EventKind.LOST, 0, b"", 1)
        assert got[1:] == [
            Event(1, EventKind.STORED, StoredReason.WRITTEN, b),
            Event(2, EventKind.REMOVED, RemovedReason.EVICTED, b),
            Event(3, EventKind.STORED, StoredReason.WRITTEN, c),
        ]
        assert isinstance(got[2].reason, RemovedReason)
        assert tier.stats().events_dropped == 1
        assert tier.poll_events() == []
        tier.clear()
        cleared = tier.poll_events(max=1) + tier.poll_events(max=1)
        assert sorted(e.key for e in cleared) == [a, c]
        assert {(e.kind, e.reason) for e in cleared} == {(EventKind.REMOVED, RemovedReason.CLEARED)}
        assert [e.seq for e in cleared] == [4, 5]
        raises(kvtier.TIER_ERR_INVALID_ARG, tier.poll_events, 0)
    _, quiet = make(rows=4, capacity_bytes=2 * ROW)
    with quiet:
        err = raises(kvtier.TIER_ERR_CONFIG, quiet.poll_events)
        assert "events=true" in err.message
    raises(kvtier.TIER_ERR_CONFIG, make, events="sometimes")


def test_pending_then_hit_and_clear():
    buf, tier = make(rows=64, row=1 << 20, capacity_bytes="64MiB", io_threads=1)
    with tier:
        keys = [key(i) for i in range(64)]
        tier.submit_store(1, keys, range(64))
        assert tier.lookup_one(keys[-1]) in (LookupState.PENDING, LookupState.HIT)
        tier.drain()
        assert tier.stats().results_queued == 1
        assert tier.lookup(keys) == [LookupState.HIT] * 64
        assert results(tier, 1)[0].ok
        tier.clear()
        assert tier.lookup(keys[:3]) == [LookupState.MISS] * 3


def test_wait_times_out_and_wakes():
    buf, tier = make()
    with tier:
        t0 = time.monotonic()
        assert tier.wait(0.1) is False
        assert 0.05 < time.monotonic() - t0 < 2
        assert tier.wait(0) is False
        tier.submit_store(1, [key(1)], [0])
        assert tier.wait(5.0) is True
        assert tier.wait(None) is True  # a result is still unpolled
        assert len(tier.poll()) == 1


def test_stats_fields():
    buf, tier = make(rows=4, capacity_bytes=4 * ROW, io_threads=3)
    with tier:
        tier.submit_store(1, [key(1)], [0])
        results(tier, 1)
        tier.lookup([key(1), key(2)])
        s = tier.stats()
        assert s.as_dict()["capacity_bytes"] == 4 * ROW
        assert (s.block_bytes, s.io_threads, s.stores_ok, s.bytes_stored) == (ROW, 3, 1, ROW)
        assert (s.lookups, s.hits, s.misses, s.jobs_in_flight) == (2, 1, 1, 0)


# -- failed jobs (accepted, reported once with a failure status) ----------------


def test_load_of_missing_key_reports_not_found_with_num_done():
    buf, tier = make()
    with tier:
        fill(buf, [0, 1])
        tier.submit_store(1, [key(1), key(2)], [0, 1])
        results(tier, 1)
        tier.submit_load(2, [key(1), key(2), key(3)], [5, 6, 7])
        [r] = results(tier, 1)
        assert (r.ok, r.status, r.status_name, r.num_blocks, r.num_done) == (
            False, kvtier.TIER_ERR_NOT_FOUND, "TIER_ERR_NOT_FOUND", 3, 2)
        assert np.array_equal(buf[5], buf[0]) and np.array_equal(buf[6], buf[1])
        tier.submit_load(3, [key(3), key(1)], [5, 6])
        [r] = results(tier, 1)
        assert (r.status, r.num_done) == (kvtier.TIER_ERR_NOT_FOUND, 0)


def test_store_without_space_reports_no_space():
    buf, tier = make(rows=8, capacity_bytes=2 * ROW)
    with tier:
        tier.submit_store(1, [key(i) for i in range(3)], [0, 1, 2])
        [r] = results(tier, 1)
        assert r.status == kvtier.TIER_ERR_NO_SPACE
        assert tier.stats().num_blocks == 0


# -- rejected calls: KVTierError with the right status -------------------------


@pytest.mark.parametrize("bad", [b"", b"x" * 129])
def test_wrong_key_length(bad):
    buf, tier = make()
    with tier:
        e = raises(kvtier.TIER_ERR_INVALID_ARG, tier.lookup, [bad])
        assert "key_len" in e.message  # tier_last_error's text
        raises(kvtier.TIER_ERR_INVALID_ARG, tier.lookup_one, bad)
        raises(kvtier.TIER_ERR_INVALID_ARG, tier.touch, [bad, bad])
        raises(kvtier.TIER_ERR_INVALID_ARG, tier.submit_store, 1, [bad], [0])
        raises(kvtier.TIER_ERR_INVALID_ARG, tier.submit_load, 2, [bad], [0])
        assert tier.lookup([b"x" * 128]) == [LookupState.MISS]
        assert tier.poll() == []  # rejected submits produce no result


def test_mixed_key_lengths():
    buf, tier = make()
    with tier:
        raises(kvtier.TIER_ERR_INVALID_ARG, tier.lookup, [b"abcd", b"ab"])
        # Same total length as three 4-byte keys: still caught.
        e = raises(kvtier.TIER_ERR_INVALID_ARG, tier.submit_store, 1, [b"abcd", b"ab", b"abcdef"], [0, 1, 2])
        assert "same length" in e.message
        raises(kvtier.TIER_ERR_INVALID_ARG, tier.touch, [b"a", b"bb"])


def test_bad_key_objects():
    buf, tier = make()
    with tier:
        raises(kvtier.TIER_ERR_INVALID_ARG, tier.lookup, b"single-key")
        raises(kvtier.TIER_ERR_INVALID_ARG, tier.lookup, ["text", "keys"])
        raises(kvtier.TIER_ERR_INVALID_ARG, tier.submit_store, 1, [b"ab", 12], [0, 1])
        # Any bytes-like key and any collection of keys work.
        assert tier.lookup([bytearray(b"ab")]) == [LookupState.MISS]
        assert tier.lookup({b"ab"}) == [LookupState.MISS]
        assert tier.lookup(k for k in [b"ab", b"cd"]) == [LookupState.MISS] * 2


@pytest.mark.parametrize(
    "ids",
    [[16], [-1], [0, 16], np.array([99], dtype=np.int32), np.array([2**63], dtype=np.uint64), [2**63], [2**70]],
)
def test_block_id_out_of_range(ids):
    buf, tier = make(rows=16)
    with tier:
        keys = [key(i) for i in range(len(ids))]
        raises(kvtier.TIER_ERR_OUT_OF_RANGE, tier.submit_store, 1, keys, ids)
        raises(kvtier.TIER_ERR_OUT_OF_RANGE, tier.submit_load, 2, keys, ids)
        assert tier.poll() == []


def test_block_id_shapes_and_types():
    buf, tier = make(rows=16)
    with tier:
        raises(kvtier.TIER_ERR_INVALID_ARG, tier.submit_store, 1, [key(1)], [0, 1])
        raises(kvtier.TIER_ERR_INVALID_ARG, tier.submit_store, 1, [key(1)], np.array([0.0]))
        raises(kvtier.TIER_ERR_INVALID_ARG, tier.submit_store, 1, [key(1)], np.array([[0]]))
        raises(kvtier.TIER_ERR_INVALID_ARG, tier.submit_store, 1, [key(1)], ["0"])
        # Strided, int32 and uint8 arrays are converted, not rejected.
        ids = np.arange(8, dtype=np.int64)[::4]
        tier.submit_store(1, [key(1), key(2)], ids)
        tier.submit_store(2, [key(3)], np.array([5], dtype=np.uint8))
        tier.submit_store(3, [key(4)], range(6, 7))
        assert all(r.ok for r in results(tier, 3))


def test_job_ids():
    buf, tier = make()
    with tier:
        raises(kvtier.TIER_ERR_INVALID_ARG, tier.submit_store, -1, [key(1)], [0])
        raises(kvtier.TIER_ERR_INVALID_ARG, tier.submit_store, 2**64, [key(1)], [0])
        raises(kvtier.TIER_ERR_INVALID_ARG, tier.submit_store, 1.5, [key(1)], [0])
        tier.submit_store(2**64 - 1, [key(1)], [0])
        tier.submit_store(np.int64(5), [key(2)], [1])
        assert {r.job_id for r in results(tier, 2)} == {2**64 - 1, 5}


def test_duplicate_job_id_until_polled():
    buf, tier = make()
    with tier:
        tier.submit_store(9, [key(1)], [0])
        e = raises(kvtier.TIER_ERR_DUPLICATE_JOB, tier.submit_load, 9, [key(1)], [1])
        assert "9" in e.message
        tier.drain()
        raises(kvtier.TIER_ERR_DUPLICATE_JOB, tier.submit_store, 9, [key(2)], [1])
        [r] = results(tier, 1)
        assert (r.job_id, r.kind) == (9, kvtier.JobKind.STORE)
        tier.submit_load(9, [key(1)], [1])  # polled: the id is free again
        assert results(tier, 1)[0].is_load


@pytest.mark.parametrize(
    "cfg",
    [
        {"no_such_key": "1"},
        {"capacity_bytes": "lots"},
        {"capacity_bytes": -5},
        {"io_threads": 0},
        {"io_threads": "many"},
        {"backend": "tape"},
        {"capacity_bytes": "1\0GiB"},
    ],
)
def test_bad_config(cfg):
    buf = np.zeros((4, ROW), dtype=np.uint8)
    raises(kvtier.TIER_ERR_CONFIG, Tier, buf, **cfg)


def test_config_values_as_strings_and_ints():
    buf = np.zeros((4, ROW), dtype=np.uint8)
    for cap in ("16KiB", 16384, "16384"):
        with Tier(buf, capacity_bytes=cap, io_threads="1", idle_spin_us=0, backend="memory") as t:
            s = t.stats()
            assert (s.capacity_bytes, s.io_threads) == (16384, 1)
    with Tier(buf, capacity_bytes=None) as t:  # None: library default
        assert t.stats().capacity_bytes == 1 << 30


def test_prefault_full_makes_the_capacity_resident():
    buf = np.zeros((4, ROW), dtype=np.uint8)
    with Tier(buf, capacity_bytes="8MiB", prefault="full") as t:
        deadline = time.monotonic() + 60
        while t.stats().resident_bytes < 8 << 20 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert t.stats().resident_bytes == 8 << 20
    with Tier(buf, capacity_bytes="8MiB", prefault="off") as t:
        assert t.stats().resident_bytes == 0
    e = raises(kvtier.TIER_ERR_CONFIG, Tier, buf, prefault="sometimes")
    assert "prefault" in e.message


def test_capacity_below_one_block():
    buf = np.zeros((4, ROW), dtype=np.uint8)
    e = raises(kvtier.TIER_ERR_CONFIG, Tier, buf, capacity_bytes=ROW - 1)
    assert "capacity" in e.message


@pytest.mark.parametrize("block_bytes", [0, 3000, 5 * ROW])
def test_block_bytes_must_divide_the_buffer(block_bytes):
    buf = np.zeros((4, ROW), dtype=np.uint8)
    raises(kvtier.TIER_ERR_INVALID_ARG, Tier, buf, block_bytes=block_bytes)


def test_unusable_buffers():
    raises(kvtier.TIER_ERR_INVALID_ARG, Tier, b"\0" * ROW)  # read-only
    raises(kvtier.TIER_ERR_INVALID_ARG, Tier, np.zeros((4, ROW), np.uint8)[:, ::2])
    raises(kvtier.TIER_ERR_INVALID_ARG, Tier, bytearray())
    raises(kvtier.TIER_ERR_INVALID_ARG, Tier, [1, 2, 3])
    raises(kvtier.TIER_ERR_INVALID_ARG, Tier, np.zeros((4, ROW), np.uint8), block_bytes=-1)


def test_poll_max_and_many_results():
    buf, tier = make(rows=8)
    with tier:
        raises(kvtier.TIER_ERR_INVALID_ARG, tier.poll, 0)
        for j in range(10):
            tier.submit_store(j, [key(j)], [j % 8])
        tier.drain()
        first = tier.poll(max=3)
        rest = tier.poll()
        assert len(first) == 3 and len(rest) == 7
        assert sorted(r.job_id for r in first + rest) == list(range(10))
        # More results than one internal poll buffer holds (256).
        for j in range(700):
            tier.submit_load(j, [key(j % 8)], [j % 8])
        tier.drain()
        first, rest = tier.poll(max=300), tier.poll()
        assert (len(first), len(rest)) == (300, 400)
        assert sorted(r.job_id for r in first + rest) == list(range(700))
        assert all(r.ok and r.is_load and r.bytes == ROW for r in first + rest)


def test_error_is_picklable_and_carries_last_error():
    buf, tier = make(rows=2)
    with tier:
        e = raises(kvtier.TIER_ERR_OUT_OF_RANGE, tier.submit_store, 1, [key(1)], [2])
        assert "block_ids" in e.message and "2" in e.message
        e2 = pickle.loads(pickle.dumps(e))
        assert (e2.status, e2.status_name, str(e2)) == (e.status, e.status_name, str(e))


# -- lifetime -----------------------------------------------------------------


def test_close_twice_and_use_after_close():
    buf, tier = make()
    tier.submit_store(1, [key(1)], [0])  # abandoned by close: fine
    tier.close()
    tier.close()
    assert tier.closed and "closed" in repr(tier)
    calls = [
        (tier.lookup, [key(1)]),
        (tier.lookup_one, key(1)),
        (tier.touch, [key(1)]),
        (tier.submit_store, 1, [key(1)], [0]),
        (tier.submit_load, 1, [key(1)], [0]),
        (tier.poll,),
        (tier.wait, 0.01),
        (tier.drain,),
        (tier.clear,),
        (tier.stats,),
    ]
    for fn, *args in calls:
        raises(kvtier.TIER_ERR_SHUTDOWN, fn, *args)
    with tier:  # a closed tier in a with block: still no crash
        pass


def test_context_manager_closes():
    buf, tier = make()
    with tier as t:
        assert t is tier and not tier.closed
    assert tier.closed


def test_buffer_kept_alive_by_the_tier():
    arr = np.zeros((4, ROW), dtype=np.uint8)
    arr[0] = 77
    alive = weakref.ref(arr)
    tier = Tier(arr, capacity_bytes="64KiB")
    del arr
    gc.collect()
    assert alive() is not None
    tier.submit_store(1, [key(1)], [0])
    tier.submit_load(2, [key(1)], [3])
    assert all(r.ok for r in results(tier, 2))
    assert (alive()[3] == 77).all()
    tier.close()
    gc.collect()
    assert alive() is None  # and released on close

    tier = Tier(bytearray(4 * ROW), block_bytes=ROW, capacity_bytes="64KiB")
    gc.collect()
    tier.submit_store(1, [key(1)], [0])
    assert results(tier, 1)[0].ok
    tier.close()


def test_export_blocks_resize_until_close():
    buf = bytearray(4 * ROW)
    tier = Tier(buf, block_bytes=ROW, capacity_bytes="64KiB")
    with pytest.raises(BufferError):
        buf.extend(b"x")  # would move the memory under the library
    tier.close()
    buf.extend(b"x")


def test_garbage_collected_tier_frees_itself():
    buf = np.zeros((4, ROW), dtype=np.uint8)
    before = threading.active_count(), len(os.listdir("/proc/self/task"))
    for _ in range(20):
        Tier(buf, capacity_bytes="64KiB", io_threads=4).submit_store(1, [key(1)], [0])
        gc.collect()
    assert len(os.listdir("/proc/self/task")) <= before[1] + 1


# -- threads ------------------------------------------------------------------


def test_many_threads_exactly_once():
    rows, threads, jobs_each = 64, 8, 60
    buf, tier = make(rows=rows, capacity_bytes=rows * ROW, io_threads=2)
    fill(buf, range(rows // 2))
    seen: list = []
    errors: list = []
    done = threading.Event()

    def poller():
        try:
            while not done.is_set() or tier.stats().jobs_in_flight or tier.stats().results_queued:
                tier.wait(0.01)
                seen.extend(tier.poll(max=7))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def worker(t: int):
        try:
            for j in range(jobs_each):
                job_id = t * 1000 + j
                src = (t * jobs_each + j) % (rows // 2)
                k = key(src)
                if j % 2 == 0:
                    tier.submit_store(job_id, [k], [src])
                else:
                    tier.submit_load(job_id, [k], [rows // 2 + t])
                tier.lookup([k, key(10_000 + j)])
                tier.touch([k])
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    pollers = [threading.Thread(target=poller) for _ in range(2)]
    workers = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for th in pollers + workers:
        th.start()
    for th in workers:
        th.join()
    tier.drain()
    done.set()
    for th in pollers:
        th.join()
    seen.extend(tier.poll())
    assert not errors, errors
    ids = [r.job_id for r in seen]
    assert len(ids) == len(set(ids)) == threads * jobs_each
    assert all(r.ok or r.status == kvtier.TIER_ERR_NOT_FOUND for r in seen)
    tier.close()


def test_close_while_other_threads_call():
    buf, tier = make(rows=16)
    stop = threading.Event()
    outcomes: list = []

    def hammer(t: int):
        n = 0
        while not stop.is_set():
            try:
                tier.lookup([key(n)])
                tier.submit_store(t * 1_000_000 + n, [key(n)], [n % 16])
                tier.poll()
                n += 1
            except KVTierError as exc:
                outcomes.append(exc.status)
                if exc.status == kvtier.TIER_ERR_SHUTDOWN:
                    return

    ths = [threading.Thread(target=hammer, args=(t,)) for t in range(4)]
    for th in ths:
        th.start()
    time.sleep(0.2)
    tier.close()
    stop.set()
    for th in ths:
        th.join(5)
        assert not th.is_alive()
    assert outcomes and set(outcomes) <= {kvtier.TIER_ERR_SHUTDOWN, kvtier.TIER_ERR_NO_SPACE}


# -- after fork -----------------------------------------------------------------


def _use_inherited_tier(tier: Tier, conn) -> None:
    """Runs in a forked child: reports each call on the inherited tier as it
    happens, so a hang shows where it was."""
    calls = [
        ("submit_store", tier.submit_store, 7, [key(7)], [0]),
        ("wait", tier.wait, 2),
        ("drain", tier.drain),
        ("poll", tier.poll),
        ("lookup", tier.lookup, [key(1)]),
        ("lookup_one", tier.lookup_one, key(1)),
        ("touch", tier.touch, [key(1)]),
        ("submit_load", tier.submit_load, 8, [key(1)], [1]),
        ("clear", tier.clear),
        ("stats", tier.stats),
    ]
    for name, fn, *args in calls:
        try:
            outcome = ("returned", repr(fn(*args)))
        except KVTierError as exc:
            outcome = ("raised", exc.status, str(exc))
        conn.send((name, outcome))
    tier.close()  # must return: no waiting for the parent's threads or calls
    conn.send(("close", ("returned", None)))
    # A tier of the child's own works.
    buf, own = make(rows=4)
    with own:
        fill(buf, [0])
        own.submit_store(1, [key(1)], [0])
        own.submit_load(2, [key(1)], [3])
        own.drain()
        ok = [r.ok for r in own.poll()] == [True, True] and (buf[3] == buf[0]).all()
    conn.send(("new tier", ("returned", ok)))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # 3.12+: fork with threads
def test_inherited_tier_raises_in_forked_child():
    buf, tier = make(rows=4)
    fill(buf, [0])
    tier.submit_store(1, [key(1)], [0])
    results(tier, 1)
    # A thread inside a call while the process forks: the child's copy of the
    # tier lists that call as in progress forever, and close() must not wait
    # for it. (In the parent the wait ends with the next result; the limit and
    # daemon=True keep a failing run from hanging on it.)
    waiter = threading.Thread(target=tier.wait, args=(60,), daemon=True)
    waiter.start()
    while not tier._calls:
        time.sleep(0.001)
    ctx = multiprocessing.get_context("fork")
    parent_conn, child_conn = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_use_inherited_tier, args=(tier, child_conn))
    child.start()
    child_conn.close()
    seen = {}
    deadline = time.monotonic() + 30
    try:
        while len(seen) < 12:
            left = deadline - time.monotonic()
            if left <= 0 or not parent_conn.poll(left):
                pytest.fail(f"the child hung after {list(seen.items())}")
            try:
                name, outcome = parent_conn.recv()
            except EOFError:
                pytest.fail(f"the child died (exit code {child.exitcode}) after {seen}")
            seen[name] = outcome
    finally:
        child.join(5)
        if child.is_alive():
            child.kill()
            child.join()
    assert child.exitcode == 0
    owner = f"the tier belongs to process {os.getpid()}"
    for name, outcome in seen.items():
        if name in ("close", "new tier"):
            assert outcome == ("returned", None if name == "close" else True), (name, outcome)
            continue
        assert outcome[0] == "raised", (name, outcome)
        status, text = outcome[1:]
        assert status == kvtier.TIER_ERR_SHUTDOWN, (name, text)
        assert "TIER_ERR_SHUTDOWN" in text and owner in text, (name, text)
        assert f"(pid {child.pid})" in text, (name, text)
        assert "create a new tier after fork" in text, (name, text)
    # The parent's tier is unaffected, and its wait in progress ends with the
    # next result. Nothing polls before the waiter is done: a poll could take
    # the results before the waiter looks (it only sees queued results), and
    # who looks first is up to the scheduler.
    tier.submit_load(2, [key(1)], [2])
    tier.submit_store(3, [key(2)], [1])
    waiter.join(5)
    assert not waiter.is_alive()
    assert all(r.ok for r in results(tier, 2))
    assert (buf[2] == buf[0]).all()
    assert tier.lookup([key(1), key(2)]) == [LookupState.HIT, LookupState.HIT]
    tier.close()


# -- without numpy ------------------------------------------------------------


def test_works_without_numpy():
    code = r"""
import sys
sys.modules["numpy"] = None  # make `import numpy` fail
import kvtier
buf = bytearray(4 * 1024)
buf[:1024] = b"\x11" * 1024
with kvtier.Tier(buf, block_bytes=1024, capacity_bytes=8192) as t:
    t.submit_store(1, [b"k1"], [0])
    t.submit_load(2, [b"k1"], (2,))
    t.drain()
    assert all(r.ok for r in t.poll())
assert buf[2048:3072] == b"\x11" * 1024
print("ok")
"""
    env = child_env()
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


# -- a store cut short by clear() ---------------------------------------------------


def test_store_cleared_in_flight_reports_blocks_present():
    """num_done of a store counts the job's blocks present when it completed."""
    buf, tier = make(rows=64, row=1 << 20, capacity_bytes="128MiB", io_threads=1)
    with tier:
        keys = [key(i) for i in range(64)]
        tier.submit_store(1, keys, range(64))
        tier.clear()
        if tier.stats().jobs_in_flight != 1:
            pytest.skip("the store finished before clear(); cannot provoke the case")
        [r] = results(tier, 1)
        present = tier.lookup(keys).count(LookupState.HIT)
        assert present == 0  # clear() dropped them, as documented
        assert r.num_done == present


# -- one source per fact --------------------------------------------------


HEADER = PYTHON_DIR.parent / "include" / "kvtier.h"


@pytest.mark.skipif(not HEADER.is_file(), reason="no repository header here")
def test_status_codes_and_stats_fields_match_the_header():
    import re

    from kvtier import _lib

    text = HEADER.read_text()
    defines = dict(re.findall(r"#define (TIER_(?:OK|TIMEOUT|ERR_\w+)) \(?(-?\d+)\)?", text))
    assert {name: int(v) for name, v in defines.items()} == _lib.STATUS_CODES
    for name, code in _lib.STATUS_CODES.items():
        assert getattr(kvtier, name) == code and name in kvtier.__all__
    body = re.search(r"typedef struct tier_stats_t \{(.*?)\} tier_stats_t;", text, re.S).group(1)
    assert tuple(re.findall(r"uint64_t (\w+);", body)) == _lib.STATS_FIELDS
    assert [f.name for f in __import__("dataclasses").fields(kvtier.TierStats)] == list(
        _lib.STATS_FIELDS
    )
    body = re.search(r"typedef struct tier_job_result_t \{(.*?)\} tier_job_result_t;", text, re.S)
    header_fields = re.findall(r"^\s*\w+ (\w+);$", body.group(1), re.M)
    assert header_fields == [name for name, _ in _lib.tier_job_result_t._fields_]
    # The reserved field (the struct's spelled-out tail padding) is not data;
    # `items` comes from the caller's tier_item_result_t array, not the struct.
    assert list(kvtier.JobResult._fields) == [f for f in header_fields if f != "reserved"] + ["items"]


def test_the_package_version_is_the_library_version():
    assert kvtier.__version__ == kvtier.library_version()


def test_sealed_disk_tiers_keep_tenants_apart(tmp_path):
    """seal_key / seal_key_file pass through: a tenant reads its own blocks;
    another key misses them; a bad key is refused without being repeated."""
    key_a = bytes(range(32))
    key_file = tmp_path / "tenant-b.key"
    key_file.write_text("b2" * 32 + "\n")
    key_file.chmod(0o600)
    store = tmp_path / "store"
    buf = np.zeros((4, 4096), dtype=np.uint8)
    buf[0] = 7
    # One namespace for both tenants: only their seal keys keep them apart.
    common = dict(backend="disk", path=str(store), capacity_bytes=1 << 20, shared=True, namespace="m")
    with Tier(buf, seal_key=key_a, **common) as a, Tier(buf, seal_key_file=key_file, **common) as b:
        a.submit_store(1, [key(1)], [0])
        assert results(a, 1)[0].ok
        a.submit_load(2, [key(1)], [1])
        assert results(a, 1)[0].ok and np.array_equal(buf[1], buf[0])
        deadline = time.monotonic() + 10
        while (state := b.lookup([key(1)])[0]) == LookupState.PENDING:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        assert state == LookupState.MISS
    names = [p.name for p in store.rglob("*") if p.is_file()]
    assert not any(key(1).hex()[:16] in n for n in names), names
    with pytest.raises(KVTierError) as err:
        Tier(buf, seal_key="c3" * 31 + "zz", **common)
    assert err.value.status_name == "TIER_ERR_CONFIG"
    assert "c3c3c3c3" not in str(err.value)
    key_file.chmod(0o644)
    with pytest.raises(KVTierError) as err:
        Tier(buf, seal_key_file=str(key_file), **common)
    assert "group or others" in str(err.value)
