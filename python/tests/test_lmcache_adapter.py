"""kvtier.lmcache.KVTierL2Adapter, built by LMCache 0.5.6's plugin factory,
in what LMCache's own check mode does not cover: locks against delete and
eviction, per-cache_salt usage through kvtier's evictions, tasks in flight
from two threads, partial loads, objects scattered through the L1 arena, and
the adapter after close; extents on every tier that stores them, whole rows
on sealed ones."""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import threading

import pytest

pytest.importorskip("lmcache", reason="needs LMCache 0.5.6 (scripts/engine_env.sh installs it)")

from lmcache_helpers import (  # noqa: E402
    WAIT_S,
    Arena,
    key,
    load,
    lookup,
    make_adapter,
    present,
    store,
    wait_fd,
    wait_load,
    wait_store,
)

from kvtier import KVTierError  # noqa: E402
from kvtier.lmcache import KVTierL2Adapter  # noqa: E402

KIB = 1024
BLOCK = 64 * KIB


@pytest.fixture
def arena():
    return Arena(16 << 20)


SEAL_KEY = "0123456789abcdef" * 4


@pytest.fixture
def persist_path():
    """A fresh ``persist_path`` on tmpfs, removed afterwards."""
    parent = tempfile.mkdtemp(prefix="kvtier-lmcache-", dir="/dev/shm")
    try:
        yield os.path.join(parent, "arena")
    finally:
        shutil.rmtree(parent, ignore_errors=True)


def _params(request, kind, tmp_path):
    """kvtier params of one kind of tier: memory, persist (memory with
    ``persist_path``), disk, redis, and the sealed disk and Redis."""
    if kind == "persist":
        return {"backend": "memory", "persist_path": request.getfixturevalue("persist_path")}
    if kind.endswith("disk"):
        params = {"backend": "disk", "path": str(tmp_path / "kv")}
    elif kind.endswith("redis"):
        params = {"backend": "redis", "url": request.getfixturevalue("redis_url")}
    else:
        params = {"backend": "memory"}
    if kind.startswith("sealed"):
        params["seal_key"] = SEAL_KEY
    return params


@pytest.fixture(params=["memory", "persist", "disk", "redis"])
def backend(request, tmp_path):
    """Params of each kind of tier the library stores extents on."""
    return _params(request, request.param, tmp_path)


def _adapter(arena, **params):
    params.setdefault("block_bytes", BLOCK)
    params.setdefault("capacity_bytes", 64 * BLOCK)
    return make_adapter(arena, **params)


def _objs(arena, start, count, size=BLOCK, stride=BLOCK):
    return [arena.obj(start + i * stride, size) for i in range(count)]


def _usage_by_salt(adapter):
    return dict(adapter.get_usage().bytes_by_cache_salt)


def test_built_by_lmcache_plugin_factory_with_three_distinct_fds(arena):
    adapter = _adapter(arena)
    try:
        assert isinstance(adapter, KVTierL2Adapter)
        fds = {adapter.get_store_event_fd(), adapter.get_lookup_and_lock_event_fd(), adapter.get_load_event_fd()}
        assert len(fds) == 3
        assert adapter.namespace.startswith("lmcache/k1/")
        assert adapter.get_usage().total_bytes_used == 0
    finally:
        adapter.close()


def test_config_errors_are_clear(arena):
    with pytest.raises(ValueError, match="block_bytes"):
        make_adapter(arena, backend="memory")
    with pytest.raises(ValueError, match="block_bytes must be a positive size"):
        make_adapter(arena, block_bytes="lots")
    with pytest.raises(KVTierError, match="no_such_key"):
        make_adapter(arena, block_bytes=BLOCK, no_such_key=1)
    with pytest.raises(ValueError, match="events must stay on"):
        make_adapter(arena, block_bytes=BLOCK, events=False)


def test_lock_holds_against_delete_and_unlock_never_fails(arena, backend):
    adapter = _adapter(arena, **backend)
    try:
        keys = [key(i) for i in range(4)]
        objs = _objs(arena, 0, 4)
        want = [arena.fill(o, i) for i, o in enumerate(objs)]
        assert store(adapter, keys, objs).is_successful()
        assert lookup(adapter, keys[:2]) == [True, True]  # keys 0 and 1 locked
        adapter.delete(keys)
        # The locked two survive the delete; the others are gone and counted out.
        assert present(adapter, keys) == [True, True, False, False]
        assert adapter.get_usage().total_bytes_used == 2 * BLOCK
        out = _objs(arena, 8 * BLOCK, 2)
        assert load(adapter, keys[:2], out) == [True, True]
        assert [bytes(o.raw_data.numpy()) for o in out] == want[:2]
        adapter.submit_unlock(keys[:2])
        adapter.submit_unlock([key(99)])  # never locked: ignored
        adapter.submit_unlock(keys[:2])  # one unlock too many: ignored
        adapter.delete(keys[:2])
        assert present(adapter, keys) == [False] * 4
        assert adapter.get_usage().total_bytes_used == 0
        assert _usage_by_salt(adapter) == {}
    finally:
        adapter.close()


def test_two_locks_need_two_unlocks(arena):
    adapter = _adapter(arena)
    try:
        k = [key(1)]
        arena.fill(_objs(arena, 0, 1)[0], 1)
        assert store(adapter, k, _objs(arena, 0, 1)).is_successful()
        assert lookup(adapter, k) == [True]
        assert lookup(adapter, k) == [True]
        adapter.submit_unlock(k)
        adapter.delete(k)
        assert present(adapter, k) == [True]  # one lock still held
        adapter.submit_unlock(k)
        adapter.delete(k)
        assert present(adapter, k) == [False]
    finally:
        adapter.close()


def test_per_salt_usage_stays_exact_through_evictions_and_locks_hold(arena):
    # Room for 8 objects: 24 stores of three salts evict, except the locked one.
    adapter = _adapter(arena, capacity_bytes=8 * BLOCK)
    try:
        salts = ["alice", "bob", ""]
        first = [key(0, salt="alice")]
        arena.fill(_objs(arena, 0, 1)[0], 0)
        assert store(adapter, first, _objs(arena, 0, 1)).is_successful()
        assert lookup(adapter, first) == [True]  # locked: never evicted
        all_keys = list(first)
        for i in range(1, 24):
            k = [key(i, salt=salts[i % 3])]
            size = BLOCK - 4096 * (i % 4)  # objects of several sizes
            obj = arena.obj((i % 16) * BLOCK, size)
            arena.fill(obj, i)
            result = store(adapter, k, [obj])
            assert result.is_successful(), i
            all_keys += k
        held = present(adapter, all_keys)
        assert held[0], "the locked object was evicted"
        assert 1 < sum(held) <= 8, held  # kvtier evicted the rest
        want: dict[str, int] = {}
        for k, here in zip(all_keys, held):
            if here:
                i = int.from_bytes(k.chunk_hash[:8], "big")
                want[k.cache_salt] = want.get(k.cache_salt, 0) + (BLOCK if i == 0 else BLOCK - 4096 * (i % 4))
        assert _usage_by_salt(adapter) == want
        assert adapter.get_usage().total_bytes_used == sum(want.values())
        listed = {}
        page = adapter.list_l2_keys(page_size=3)
        entries = list(page.entries)
        while page.next_page_token is not None:
            page = adapter.list_l2_keys(page_size=3, cursor=page.next_page_token)
            entries += page.entries
        for entry in entries:
            listed[entry.key.cache_salt] = listed.get(entry.key.cache_salt, 0) + entry.size_bytes
        assert listed == want
        assert len(entries) == sum(held)
        assert adapter.list_l2_keys(model_name="other/model").entries == ()
        adapter.submit_unlock(first)
    finally:
        adapter.close()


def test_eight_tasks_in_flight_from_two_threads(arena):
    adapter = _adapter(arena)
    per_task = 4
    tasks: dict[int, list] = {}
    payload: dict[int, bytes] = {}
    errors: list[BaseException] = []
    lock = threading.Lock()

    def submit(thread_no: int) -> None:
        try:
            for t in range(4):
                n = thread_no * 4 + t
                ks = [key(n * per_task + j) for j in range(per_task)]
                objs = _objs(arena, n * per_task * BLOCK, per_task)
                for j, o in enumerate(objs):
                    payload[n * per_task + j] = arena.fill(o, n * per_task + j)
                task = adapter.submit_store_task(ks, objs)
                with lock:
                    tasks[task] = ks
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    try:
        threads = [threading.Thread(target=submit, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        assert len(tasks) == 8
        results = wait_store(adapter, set(tasks))
        assert all(r.is_successful() for r in results.values())
        assert sum(r.bytes_transferred() for r in results.values()) == 32 * BLOCK
        arena.tensor[: 32 * BLOCK].zero_()
        loads: dict[int, list] = {}

        def submit_loads(thread_no: int) -> None:
            for t in range(4):
                n = thread_no * 4 + t
                ks = [key(n * per_task + j) for j in range(per_task)]
                task = adapter.submit_load_task(ks, _objs(arena, n * per_task * BLOCK, per_task))
                with lock:
                    loads[task] = ks

        threads = [threading.Thread(target=submit_loads, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for task in loads:
            assert wait_load(adapter, task, per_task) == [True] * per_task
        for i in range(32):
            assert bytes(arena.tensor[i * BLOCK : (i + 1) * BLOCK].numpy()) == payload[i], i
        assert adapter.get_usage().total_bytes_used == 32 * BLOCK
    finally:
        adapter.close()


def test_partial_load_sets_only_the_present_keys(arena, backend):
    adapter = _adapter(arena, **backend)
    try:
        keys = [key(i) for i in range(6)]
        objs = _objs(arena, 0, 6)
        want = [arena.fill(o, i) for i, o in enumerate(objs)]
        assert store(adapter, keys[::2], objs[::2]).is_successful()
        out = _objs(arena, 8 * BLOCK, 6)
        for o in out:
            o.raw_data.fill_(0xAB)
        assert load(adapter, keys, out) == [True, False, True, False, True, False]
        for i, o in enumerate(out):
            got = bytes(o.raw_data.numpy())
            assert got == (want[i] if i % 2 == 0 else b"\xab" * BLOCK), i
    finally:
        adapter.close()


def test_objects_scattered_through_the_arena(arena, backend):
    adapter = _adapter(arena, block_bytes=256 * KIB, **backend)
    try:
        rng = random.Random(59)
        # Disjoint objects of 1 byte to 256 KiB anywhere in the 16 MiB arena
        # (unaligned starts too), stored, then loaded into other places.
        spots = rng.sample(range(16), 12)  # 1 MiB regions, in random order
        objs, outs, keys, want = [], [], [], []
        for n, spot in enumerate(spots):
            size = rng.choice([1, 4095, 4096, 65537, 256 * KIB])
            obj = arena.obj(spot * 1024 * KIB + rng.randrange(0, 4096, 64), size)
            objs.append(obj)
            outs.append(arena.obj(spot * 1024 * KIB + 512 * KIB + 8, size))
            keys.append(key(n, salt="s"))
            want.append(arena.fill(obj, n))
        assert store(adapter, keys, objs).is_successful()
        assert _usage_by_salt(adapter) == {"s": sum(len(w) for w in want)}
        assert load(adapter, keys, outs) == [True] * len(keys)
        for n, out in enumerate(outs):
            assert bytes(out.raw_data.numpy()) == want[n], n
        # An object outside the arena fails its store task, and its load bit.
        foreign = Arena(BLOCK)
        outside = foreign.obj(0, BLOCK)
        assert not store(adapter, [key(1000)], [outside]).is_successful()
        assert load(adapter, [keys[0], key(1000)], [outs[0], outside]) == [True, False]
        # An object larger than block_bytes, too.
        assert not store(adapter, [key(1001)], [arena.obj(0, 256 * KIB + 1)]).is_successful()
    finally:
        adapter.close()


def test_arena_tail_past_the_last_whole_block():
    arena = Arena(4 * BLOCK + 4096)
    adapter = make_adapter(arena, block_bytes=BLOCK)
    try:
        assert not store(adapter, [key(1)], [arena.obj(4 * BLOCK, 4096)]).is_successful()
        assert store(adapter, [key(2)], [arena.obj(3 * BLOCK, BLOCK)]).is_successful()
        assert present(adapter, [key(1), key(2)]) == [False, True]
    finally:
        adapter.close()
    with pytest.raises(ValueError, match="smaller than block_bytes"):
        make_adapter(Arena(4096), block_bytes=BLOCK)


@pytest.mark.parametrize(
    "kind, extents",
    [("memory", True), ("persist", True), ("disk", True), ("redis", True),
     ("sealed disk", False), ("sealed redis", False)],
)
def test_extents_exactly_where_the_library_stores_them(request, tmp_path, arena, kind, extents):
    """The adapter asks the tier; this pins down the answer for every kind
    of tier, and that the answer holds: half a block off a row boundary
    stores and loads where extents are, and is refused where they are not."""
    adapter = _adapter(arena, **_params(request, kind, tmp_path))
    try:
        assert adapter.extents is extents
        obj = arena.obj(BLOCK + 4096, BLOCK // 2)
        want = arena.fill(obj, 7)
        assert store(adapter, [key(7)], [obj]).is_successful() is extents
        out = arena.obj(6 * BLOCK + 100, BLOCK // 2)
        assert load(adapter, [key(7)], [out]) == [extents]
        if extents:
            assert bytes(out.raw_data.numpy()) == want
    finally:
        adapter.close()


@pytest.mark.parametrize("kind", ["sealed disk", "sealed redis"])
def test_whole_rows_on_a_sealed_tier(request, tmp_path, arena, kind):
    adapter = _adapter(arena, **_params(request, kind, tmp_path))
    try:
        assert adapter.extents is False
        # Not a whole row, or not on a row boundary: refused, logged.
        assert not store(adapter, [key(1)], [arena.obj(0, BLOCK - 4096)]).is_successful()
        assert not store(adapter, [key(2)], [arena.obj(4096, BLOCK)]).is_successful()
        obj = arena.obj(2 * BLOCK, BLOCK)
        want = arena.fill(obj, 3)
        assert store(adapter, [key(3)], [obj]).is_successful()
        # A row load stops at its first miss: the adapter loads only hits.
        out = arena.obj(5 * BLOCK, BLOCK)
        assert load(adapter, [key(9), key(3)], [arena.obj(4 * BLOCK, BLOCK), out]) == [False, True]
        assert bytes(out.raw_data.numpy()) == want
    finally:
        adapter.close()


def test_the_library_wakes_lmcache_without_the_adapters_thread(arena, backend, monkeypatch):
    """LMCache's store and load fds are written by the library as each job
    finishes, and the results collected by LMCache's own calls: with the
    adapter's thread gone, a waiter on those fds still wakes, each time, and
    finds its result and its bytes."""
    monkeypatch.setattr(KVTierL2Adapter, "_serve", lambda self: None)
    adapter = _adapter(arena, **backend)
    try:
        adapter._thread.join(WAIT_S)
        assert not adapter._thread.is_alive()
        for round_ in range(3):
            keys = [key(100 * round_ + i) for i in range(4)]
            objs = _objs(arena, 0, 4)
            want = [arena.fill(obj, 100 * round_ + i) for i, obj in enumerate(objs)]
            task = adapter.submit_store_task(keys, objs)
            assert wait_fd(adapter.get_store_event_fd(), WAIT_S), f"round {round_}: store fd never woke"
            assert adapter.pop_completed_store_tasks()[task].is_successful()
            outs = _objs(arena, 8 * BLOCK, 4)
            task = adapter.submit_load_task(keys, outs)
            assert wait_fd(adapter.get_load_event_fd(), WAIT_S), f"round {round_}: load fd never woke"
            bitmap = adapter.query_load_result(task)
            assert bitmap is not None and [bitmap.test(i) for i in range(4)] == [True] * 4
            assert [bytes(out.raw_data.numpy()) for out in outs] == want
    finally:
        adapter.close()


def test_after_close(arena):
    adapter = _adapter(arena)
    keys = [key(1)]
    assert store(adapter, keys, _objs(arena, 0, 1)).is_successful()
    assert lookup(adapter, keys) == [True]
    fds = [adapter.get_store_event_fd(), adapter.get_lookup_and_lock_event_fd(), adapter.get_load_event_fd()]
    adapter.close()
    adapter.close()  # idempotent
    for fd in fds:
        with pytest.raises(OSError):
            os.fstat(fd)
    for submit in (
        lambda: adapter.submit_store_task(keys, _objs(arena, 0, 1)),
        lambda: adapter.submit_load_task(keys, _objs(arena, 0, 1)),
        lambda: adapter.submit_lookup_and_lock_task(keys, {}),
    ):
        with pytest.raises(RuntimeError, match="after close"):
            submit()
    adapter.submit_unlock(keys)  # never raises
    adapter.delete(keys)  # nothing to do, no error
    assert adapter.pop_completed_store_tasks() == {}
    assert adapter.report_status()["is_healthy"] is False


def _reference_key(k) -> bytes:
    """The kvtier key of an ObjectKey as KEY_FORMAT 1 defines it, hashed in
    one piece (tier_keys resumes a hash of the fields before the chunk)."""
    import hashlib
    import struct

    model, salt, chunk = k.model_name.encode(), k.cache_salt.encode(), bytes(k.chunk_hash)
    data = b"".join((
        struct.pack("<BI", 1, len(model)), model,
        struct.pack("<qqI", k.kv_rank, k.object_group_id, len(salt)), salt,
        struct.pack("<I", len(chunk)), chunk,
    ))
    return hashlib.blake2b(data, digest_size=32).digest()


def test_tier_keys_are_the_key_format_digest_for_every_field_mix():
    from lmcache.v1.distributed.api import ObjectKey

    from kvtier import _lmcache_books

    # Known answer: stored objects (disk, Redis) are found by this digest.
    pinned = ObjectKey(chunk_hash=(7).to_bytes(8, "big") + b"chunk", model_name="org/model-7b",
                       kv_rank=3, object_group_id=2, cache_salt="tenant-a")
    assert _lmcache_books.tier_key(pinned).hex() == (
        "f6767ac805293b874a5ae8e5d5e76890aa93f781f1fd43f09985d451c87160f0")
    rng = random.Random(59)
    keys = [
        ObjectKey(chunk_hash=rng.randbytes(rng.choice([0, 4, 32])), model_name=rng.choice(["m", "mo", ""]),
                  kv_rank=rng.choice([0, 1, -1]), object_group_id=rng.choice([0, 5]),
                  cache_salt=rng.choice(["", "a", "ab"]))
        for _ in range(300)
    ]
    # Past the limit of remembered field prefixes too (it is emptied, not wrong).
    keys += [key(i, salt=f"s{i}") for i in range(_lmcache_books._PREFIX_LIMIT + 10)]
    got = _lmcache_books.tier_keys(keys)
    assert got == [_reference_key(k) for k in keys]
    assert len(set(got)) == len(set(keys))
