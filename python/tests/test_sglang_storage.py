"""KVTierStorage's storage promises through SGLang's own path (factory, real
CPU host pool, controller page functions): a wrong-size or corrupt page is a
miss, the disk backend survives a restart, two backends share one Redis
keyspace, SGLang's failure injector, threads sharing one backend."""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import pytest

from sglang_helpers import (  # noqa: I001 (skips the module without SGLang)
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
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageFailureInjector


def _block_files(root: Path, key: str) -> list[Path]:
    """A page's K segment on disk: kvtier names a block by its key in hex."""
    return list(root.rglob(f"{(key + '.000').encode().hex()}.kvb"))


def _redis_cli(url: str, *args: str) -> str:
    port = url.rsplit(":", 1)[1]
    return subprocess.run(["redis-cli", "-p", port, *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def _redis_value(url: str, key: str) -> str:
    names = _redis_cli(url, "--scan", "--pattern", f"*{(key + '.000').encode().hex()}*").split()
    assert len(names) == 1, names
    return names[0]


@pytest.mark.parametrize("damage", ["short", "flipped"])
def test_a_wrong_size_or_corrupt_page_on_disk_is_a_miss(tmp_path, damage):
    root = tmp_path / "kv"
    backend = make_backend({"backend": "disk", "path": str(root)})
    pool = make_pool("page_first")
    ctrl = attach(backend, pool)
    fill(pool)
    want = [page(pool, i) for i in range(3)]
    keys = new_keys(3)
    assert store(ctrl, keys, indices(range(3)))
    [victim] = _block_files(root, keys[1])
    data = bytearray(victim.read_bytes())
    if damage == "short":
        data = data[: len(data) // 2]
    else:
        data[100] ^= 0x40
    victim.write_bytes(bytes(data))
    pool.kv_buffer.zero_()
    assert load(ctrl, keys, indices(range(3))) == 1
    assert torch.equal(page(pool, 0), want[0])
    assert backend.batch_exists(keys) == 1  # the damaged block is gone from the index
    backend.close()


@pytest.mark.parametrize("damage", ["short", "flipped"])
def test_a_wrong_size_or_corrupt_page_in_redis_is_a_miss(redis_url, damage):
    backend = make_backend({"backend": "redis", "url": redis_url})
    pool = make_pool("page_first")
    ctrl = attach(backend, pool)
    fill(pool)
    keys = new_keys(3)
    assert store(ctrl, keys, indices(range(3)))
    name = _redis_value(redis_url, keys[1])
    if damage == "short":
        _redis_cli(redis_url, "SET", name, "\x7f" * 100)
    else:
        size = int(_redis_cli(redis_url, "STRLEN", name))
        _redis_cli(redis_url, "SETRANGE", name, str(size - 7), "Z")
    pool.kv_buffer.zero_()
    assert load(ctrl, keys, indices(range(3))) == 1
    assert backend.batch_exists(keys) == 1
    backend.close()


def test_another_geometry_never_reads_these_pages(tmp_path):
    """Same directory and model, another page size or head size: other
    blocks entirely, so a miss and never a misread."""
    cfg = {"backend": "disk", "path": str(tmp_path)}
    backend = make_backend(cfg)
    _, keys = round_trip(backend, "page_first")
    backend.close()
    for kwargs in ({"page_size": 8}, {"head_dim": 32}):
        other = make_backend(cfg)
        attach(other, make_pool("page_first", **kwargs))
        assert other.batch_exists(keys) == 0
        other.close()
    other = make_backend(cfg)  # another layout: the same bytes in another order
    attach(other, make_pool("page_first_direct"))
    assert other.batch_exists(keys) == 0
    other.close()


@pytest.mark.parametrize("mla", [False, True], ids=["mha", "mla"])
def test_the_disk_backend_survives_a_restart(tmp_path, mla):
    cfg = {"backend": "disk", "path": str(tmp_path)}
    backend = make_backend(cfg, mla=mla)
    pool, keys = round_trip(backend, "page_first", mla=mla)
    want = [page(pool, i) for i in range(4)]
    backend.close()
    # A new process would see this: a new pool, a new backend, the same path.
    for v1 in (True, False):  # both interfaces read the pages (same segments, same keys)
        backend = make_backend(cfg, mla=mla, v1=v1)
        pool = make_pool("page_first", mla=mla)
        ctrl = attach(backend, pool)
        assert backend.batch_exists(keys) == 4
        assert load(ctrl, keys, indices([5, 6, 7, 8]), v1) == 4
        assert all(torch.equal(page(pool, 5 + i), want[i]) for i in range(4))
        backend.close()


def test_two_backends_share_one_redis_keyspace(redis_url):
    cfg = {"backend": "redis", "url": redis_url, "sharing": "shared"}
    first, second = make_backend(cfg), make_backend(cfg)
    pool_a, pool_b = make_pool("page_first"), make_pool("page_first")
    ctrl_a, ctrl_b = attach(first, pool_a), attach(second, pool_b)
    fill(pool_a, seed=5)
    want = [page(pool_a, i) for i in range(4)]
    keys = new_keys(4)
    assert store(ctrl_a, keys, indices(range(4)))
    # The second tier never saw these keys: its lookups probe the server
    # (PENDING), and batch_exists waits for the verdict.
    assert second.batch_exists(keys) == 4
    assert load(ctrl_b, keys, indices([8, 9, 10, 11])) == 4
    assert all(torch.equal(page(pool_b, 8 + i), want[i]) for i in range(4))
    assert second.batch_exists(new_keys(2)) == 0
    first.close()
    second.close()


def test_sglangs_failure_injector(monkeypatch, tmp_path):
    monkeypatch.setenv("SGLANG_TEST_HICACHE_BACKEND_RANDOM_FAILURE", "0.3")
    backend = make_backend({"backend": "disk", "path": str(tmp_path)})
    assert isinstance(backend, HiCacheStorageFailureInjector)
    pool = make_pool("page_first")
    ctrl = attach(backend, pool)
    stored = loaded = failed = 0
    for round_ in range(40):
        fill(pool, seed=round_)
        want = [page(pool, i) for i in range(4)]
        keys = new_keys(4)
        if not store(ctrl, keys, indices(range(4))):
            failed += 1
            continue
        stored += 1
        pool.kv_buffer.zero_()
        n = load(ctrl, keys, indices(range(4)))
        loaded += n == 4
        failed += n < 4
        assert all(torch.equal(page(pool, i), want[i]) for i in range(n))
        assert backend.batch_exists(keys) in (0, 4)
    assert stored and loaded and failed
    backend.close()
    monkeypatch.setenv("SGLANG_TEST_HICACHE_BACKEND_RANDOM_FAILURE", "1")
    backend = make_backend({"backend": "disk", "path": str(tmp_path)})
    ctrl = attach(backend, pool)
    assert not store(ctrl, new_keys(2), indices([0, 1]))
    assert backend.batch_exists(new_keys(2)) == 0
    backend.close()


def test_prefetch_and_backup_threads_share_one_backend():
    """SGLang's prefetch and backup threads call one backend at once: each
    gets its own job's result."""
    backend = make_backend({"backend": "memory", "io_threads": 2})
    pool = make_pool("page_first")
    ctrl = attach(backend, pool)
    fill(pool)
    want = [page(pool, i) for i in range(8)]
    errors: list[str] = []

    def worker(first_page: int) -> None:
        for _ in range(50):
            keys = new_keys(4)
            pages = list(range(first_page, first_page + 4))
            if not store(ctrl, keys, indices(pages)):
                errors.append("store")
            if backend.batch_exists(keys) != 4:
                errors.append("exists")
            if load(ctrl, keys, indices(pages)) != 4:
                errors.append("load")

    threads = [threading.Thread(target=worker, args=(p,)) for p in (0, 4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors[:5]
    assert all(torch.equal(page(pool, i), want[i]) for i in range(8))
    backend.close()
