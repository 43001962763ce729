"""Shared storage never serves the wrong KV through the SGLang adapter (issue
53): the namespace changes with every field that changes what a page's bytes
mean; on shared disk, Redis and Redis Cluster another model or geometry is a
miss, MHA tensor-parallel ranks stay apart and MLA ranks share; MLA ranks at
TP > 1 open a disk directory on their own; ``clear()`` clears the identity's
pages for every process, and nothing else."""

from __future__ import annotations

import json
import logging
import os
import selectors
import subprocess
import sys
import textwrap
import time
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
    store,
)

import torch

TESTS_DIR = Path(__file__).resolve().parent


def namespace_of(pool_kwargs: dict, **backend_kwargs) -> str:
    backend = make_backend({"backend": "memory"}, **backend_kwargs)
    try:
        return backend.namespace(make_pool(pool_kwargs.pop("layout", "page_first"), **pool_kwargs))
    finally:
        backend.close()


def test_the_namespace_changes_with_every_field_that_changes_a_pages_meaning():
    variants = {
        "base": ({}, {}),
        "model": ({}, dict(model="org/model-ft")),
        "dtype": (dict(dtype=torch.float16), {}),
        "layout page_first_direct": (dict(layout="page_first_direct"), {}),
        "layout layer_first": (dict(layout="layer_first"), {}),
        "page size": (dict(page_size=8), {}),
        "head size": (dict(head_dim=32), {}),
        "heads": (dict(heads=4), {}),
        "layers": (dict(layers=4), {}),
        "mla": (dict(mla=True), dict(mla=True)),
        "mla latent size": (dict(mla=True, head_dim=32), dict(mla=True)),
        "tp rank": ({}, dict(tp_rank=1, tp_size=2)),
        "tp size": ({}, dict(tp_rank=0, tp_size=2)),
        "pp rank": ({}, dict(pp=(1, 2))),
        "cp rank": ({}, dict(cp=(1, 2))),
    }
    names = {what: namespace_of(dict(pool), **backend) for what, (pool, backend) in variants.items()}
    clashes = [(a, b) for a in names for b in names if a < b and names[a] == names[b]]
    assert not clashes, (clashes, names)
    # MLA ranks hold the same latent KV, at any TP size: one namespace.
    mla = {namespace_of(dict(mla=True), mla=True, tp_rank=r, tp_size=s) for r, s in ((0, 1), (0, 2), (1, 2), (3, 4))}
    assert mla == {names["mla"]}


@pytest.fixture(params=["disk", "redis", "redis-cluster"])
def shared_store(request, tmp_path):
    """kvtier config of a store several SGLang servers share."""
    if request.param == "disk":
        return {"backend": "disk", "path": str(tmp_path / "kv"), "shared": True, "probe_ttl_ms": 50}
    url = request.getfixturevalue("redis_url" if request.param == "redis" else "redis_cluster_url")
    return {"backend": "redis", "url": url, "sharing": "shared", "probe_ttl_ms": 50,
            "key_prefix": f"t{time.monotonic_ns()}"}


def stored_pages(cfg: dict, n: int = 4, seed: int = 3, **kwargs) -> tuple[list[str], list]:
    """n pages stored by a server of the given identity; their keys and bytes."""
    pool_kwargs = kwargs.pop("pool", {})
    backend = make_backend(cfg, **kwargs)
    pool = make_pool(pool_kwargs.pop("layout", "page_first"), mla=kwargs.get("mla", False), **pool_kwargs)
    ctrl = attach(backend, pool)
    fill(pool, seed)
    keys = new_keys(n)
    assert store(ctrl, keys, indices(range(n), pool.page_size))
    want = [page(pool, i) for i in range(n)]
    backend.close()
    return keys, want


def found(cfg: dict, keys: list[str], **kwargs) -> tuple[int, int, list]:
    """What a server of the given identity finds of keys: (batch_exists,
    pages loaded, their bytes)."""
    pool_kwargs = kwargs.pop("pool", {})
    backend = make_backend(cfg, **kwargs)
    pool = make_pool(pool_kwargs.pop("layout", "page_first"), mla=kwargs.get("mla", False), **pool_kwargs)
    ctrl = attach(backend, pool)
    try:
        exists = backend.batch_exists(keys)
        where = list(range(8, 8 + len(keys)))
        loaded = load(ctrl, keys, indices(where, pool.page_size))
        return exists, loaded, [page(pool, p) for p in where[:loaded]]
    finally:
        backend.close()


def test_only_a_server_of_the_same_identity_gets_the_pages(shared_store):
    keys, want = stored_pages(shared_store)
    assert found(shared_store, keys, model="org/model-ft")[:2] == (0, 0)
    # Another page size and head count, the same segment bytes (layer_first:
    # one layer's K of a page): a block of equal size that means other KV.
    same_size = dict(layout="layer_first", page_size=8, heads=2)
    other_keys, _ = stored_pages(shared_store, pool=dict(same_size))
    assert found(shared_store, other_keys, pool=dict(layout="layer_first", page_size=4, heads=4))[:2] == (0, 0)
    exists, loaded, pages = found(shared_store, keys)
    assert (exists, loaded) == (4, 4)
    assert all(torch.equal(a, b) for a, b in zip(pages, want))


def test_mha_tp_ranks_stay_apart_and_mla_ranks_share(shared_store):
    keys, _ = stored_pages(shared_store, tp_rank=0, tp_size=2)
    assert found(shared_store, keys, tp_rank=1, tp_size=2)[:2] == (0, 0)
    assert found(shared_store, keys, tp_rank=0, tp_size=2)[:2] == (4, 4)
    keys, want = stored_pages(shared_store, mla=True, tp_rank=0, tp_size=2)
    exists, loaded, pages = found(shared_store, keys, mla=True, tp_rank=1, tp_size=2)
    assert (exists, loaded) == (4, 4) and all(torch.equal(a, b) for a, b in zip(pages, want))


def test_mla_ranks_open_a_disk_directory_shared_on_their_own(tmp_path, caplog):
    """MLA at TP > 1 on a directory the config does not call shared: every
    rank opens it shared (and says so), and rank 1 reads rank 0's pages."""
    cfg = {"backend": "disk", "path": str(tmp_path)}
    with caplog.at_level(logging.INFO, logger="kvtier.sglang"):
        writer = make_backend(cfg, mla=True, tp_rank=0, tp_size=2)
        reader = make_backend(cfg, mla=True, tp_rank=1, tp_size=2)
    assert sum("shared=True" in r.getMessage() for r in caplog.records) == 2, caplog.text
    pool0, pool1 = make_pool("page_first", mla=True), make_pool("page_first", mla=True)
    ctrl0, ctrl1 = attach(writer, pool0), attach(reader, pool1)  # both ranks open
    fill(pool0, seed=9)
    keys = new_keys(4)
    assert store(ctrl0, keys, indices(range(4)))
    assert reader.batch_exists(keys) == 4
    assert load(ctrl1, keys, indices(range(4))) == 4
    assert all(torch.equal(page(pool1, i), page(pool0, i)) for i in range(4))
    writer.close()
    reader.close()


@pytest.mark.parametrize("cfg", [{"backend": "disk", "shared": False}, {"backend": "disk", "shared": "off"},
                                 {"backend": "redis", "url": "redis://127.0.0.1:1", "sharing": "owned"}],
                         ids=["disk-false", "disk-off", "redis-owned"])
def test_mla_ranks_refuse_storage_configured_unshared(tmp_path, cfg):
    cfg = dict(cfg, path=str(tmp_path)) if cfg["backend"] == "disk" else cfg
    key = "shared" if cfg["backend"] == "disk" else "sharing"
    for rank in (0, 1):
        with pytest.raises(ValueError, match=f"MLA with tp_size=2.*Set {key}="):
            make_backend(cfg, mla=True, tp_rank=rank, tp_size=2)
    make_backend(cfg, mla=True, tp_rank=0, tp_size=1).close()  # one rank: nothing to share


def test_mla_ranks_on_memory_are_told_what_works(caplog):
    with caplog.at_level(logging.WARNING, logger="kvtier.sglang"):
        make_backend({"backend": "memory"}, mla=True, tp_rank=1, tp_size=2).close()
    [record] = [r for r in caplog.records if "MLA" in r.getMessage()]
    assert "disk backend on a directory every rank reaches, or redis" in record.getMessage()


READER = textwrap.dedent(
    r'''
    import json, sys
    import torch
    from sglang_helpers import attach, fill, indices, load, make_backend, make_pool, page

    cfg, keys, seed = json.loads(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3])
    expected = make_pool("page_first")
    fill(expected, seed)  # the writer's pages, made again from its seed
    backend = make_backend(cfg)
    pool = make_pool("page_first")
    ctrl = attach(backend, pool)
    where = list(range(8, 8 + len(keys)))
    for line in sys.stdin:
        if line.strip() != "check":
            break
        pool.kv_buffer.zero_()
        exists = backend.batch_exists(keys)
        loaded = load(ctrl, keys, indices(where))
        exact = all(torch.equal(page(pool, p), page(expected, i)) for i, p in enumerate(where[:loaded]))
        print("RESULT " + json.dumps({"exists": exists, "loaded": loaded, "exact": exact}), flush=True)
    backend.close()
    '''
)


class Reader:
    """Another SGLang server process of the same identity, asked on demand."""

    def __init__(self, tmp_path: Path, cfg: dict, keys: list[str], seed: int) -> None:
        script = tmp_path / "reader.py"
        script.write_text(READER)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS_DIR.parent), str(TESTS_DIR),
                                                          env.get("PYTHONPATH")]))
        self.log = tmp_path / "reader.log"
        self.proc = subprocess.Popen(
            [sys.executable, str(script), json.dumps(cfg), json.dumps(keys), str(seed)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log.open("w"), text=True, env=env)

    def check(self, timeout: float = 180.0) -> dict:
        self.proc.stdin.write("check\n")
        self.proc.stdin.flush()
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if sel.select(timeout=1):
                line = self.proc.stdout.readline()
                if not line:
                    break
                if line.startswith("RESULT "):
                    return json.loads(line[len("RESULT "):])
        raise AssertionError(f"the reader process gave no answer:\n{self.log.read_text()[-4000:]}")

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(60)
        finally:
            self.proc.kill()


def test_clear_clears_the_identity_for_every_process_and_nothing_else(tmp_path, shared_store):
    """SGLang calls clear() from flush_cache (after update_weights, say): once
    it returns, no server of that identity, in any process, finds a page
    stored before it; another model's pages stay."""
    writer = make_backend(shared_store)
    pool = make_pool("page_first")
    ctrl = attach(writer, pool)
    fill(pool, seed=3)
    keys = new_keys(4)
    assert store(ctrl, keys, indices(range(4)))
    other_keys, _ = stored_pages(shared_store, model="org/other-model")
    reader = Reader(tmp_path, shared_store, keys, seed=3)
    try:
        assert reader.check() == {"exists": 4, "loaded": 4, "exact": True}
        writer.clear()
        assert reader.check() == {"exists": 0, "loaded": 0, "exact": True}
        assert writer.batch_exists(keys) == 0
        assert found(shared_store, keys)[:2] == (0, 0)  # a new server of the identity too
        assert found(shared_store, other_keys, model="org/other-model")[:2] == (4, 4)
    finally:
        reader.close()
        writer.close()


@pytest.mark.parametrize("sharing", [" shared", "Shared ", "SHARED"])
def test_sharing_is_read_as_the_library_and_the_vllm_adapter_read_it(sharing):
    """" shared" is shared storage to the library (which trims), and so to
    both adapters: the namespace leaves out the DP rank as for "shared"."""
    cfg = {"backend": "valkey", "url": "redis://127.0.0.1:1", "sharing": sharing}
    backend = make_backend(cfg, dp_rank=1)
    try:
        assert backend._shared()
        assert "/dp1/" not in backend.namespace(make_pool("page_first"))
    finally:
        backend.close()
