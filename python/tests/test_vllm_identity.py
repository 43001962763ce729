"""Shared storage never serves the wrong KV through the vLLM adapter (issue
53): the adapter derives its namespace from the ``OffloadingSpec`` vLLM gives
it, by the rules of vLLM's own ``FileMapper``, and through vLLM's factory (a
real ``TieringOffloadingSpec`` and its ``get_manager()``) an engine of another
model, dtype, TP size or set of layers misses the blocks another stored on
the same shared disk directory, Redis server or Redis Cluster, while an
engine of the same identity hits them, byte-exact."""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from types import SimpleNamespace

import numpy as np
import pytest

try:
    from kvtier.vllm import KVTierSecondaryTier
    from vllm.v1.kv_offload.file_mapper import FileMapper

    from vllm_engine import HIT, MISS, ROW, Engine, block_keys, kvtier_entry, offloading_config, payload
except Exception as exc:  # ImportError, or a vLLM that fails to import
    pytest.skip(f"vLLM 0.33 is not importable ({exc!r})", allow_module_level=True)

import kvtier
from kvtier import identity

TOKENS = list(range(1000, 1000 + 4 * 16))  # four full blocks
DIGEST = re.compile(r"[0-9a-f]{12}")


def bare_spec():
    """A spec with no OffloadingConfig, as the adapter tests use."""
    return SimpleNamespace(kv_events_config=SimpleNamespace(enable_kv_cache_events=False,
                                                            self_describing_kv_events=False))


def spec_of(config):
    """What the adapter and FileMapper read of a spec: its config and
    blocks_per_chunk (a TieringOffloadingSpec has more, and needs a tier)."""
    return SimpleNamespace(config=config, blocks_per_chunk=config.cache.blocks_per_chunk)


def replace(config, **changes):
    """The config with fields of its parts replaced (``parallel__tp_size=2``)."""
    parts = {}
    for name, value in changes.items():
        part, _, field = name.partition("__")
        if field:
            parts.setdefault(part, {})[field] = value
        else:
            parts[part] = value
    for part, fields in list(parts.items()):
        if isinstance(fields, dict):
            parts[part] = dataclasses.replace(getattr(config, part), **fields)
    return dataclasses.replace(config, **parts)


def test_the_namespace_is_readable_and_ends_in_a_digest():
    config = offloading_config(kvtier_entry())
    ns = identity.vllm_namespace(spec_of(config))
    prefix, digest = ns.rsplit("/", 1)
    assert prefix == "vllm/org-model-a/float16/t16/tp1pp1/r0"
    assert DIGEST.fullmatch(digest), ns
    two = replace(config, parallel__tp_size=2, parallel__world_size=2, parallel__pcp_size=2)
    assert identity.vllm_namespace(spec_of(two)).startswith("vllm/org-model-a/float16/t16/tp2pp1pcp2/r0/")
    agnostic = replace(config, parallel__is_parallelism_agnostic=True)
    assert identity.vllm_namespace(spec_of(agnostic)).startswith("vllm/org-model-a/float16/t16/anytp/r0/")
    long_name = "/models/" + "x" * 300 + "/Llama-3.1-8B-Instruct"
    ns = identity.vllm_namespace(spec_of(replace(config, model__name=long_name)))
    assert len(ns) < 150 and "Llama-3.1-8B-Instruct" in ns
    assert identity.vllm_namespace(SimpleNamespace()) is None  # no OffloadingConfig: nothing derived


VARIANTS = {
    "model": dict(model__name="org/model-b"),
    "fine-tune of the model": dict(model__name="org/model-a-ft"),
    "dtype": dict(model__dtype="bfloat16"),
    "fp8 cache": dict(model__dtype="fp8_e4m3"),
    "tokens per hash": dict(cache__tokens_per_hash=8),
    "blocks per chunk": dict(cache__blocks_per_chunk=2),
    "tp size": dict(parallel__tp_size=2, parallel__world_size=2),
    "pp size": dict(parallel__pp_size=2, parallel__world_size=2),
    "pcp size": dict(parallel__pcp_size=2),
    "dcp size": dict(parallel__dcp_size=2),
    "rank": dict(parallel__rank=1, parallel__tp_size=2, parallel__world_size=2),
    "layer names": dict(groups=(dataclasses.replace(offloading_config({}).groups[0],
                                                    layer_names=("model.layers.0.attn",)),)),
    "tokens per block": dict(groups=(dataclasses.replace(offloading_config({}).groups[0],
                                                         tokens_per_block=32),)),
    "a second group": dict(groups=offloading_config({}).groups + (
        dataclasses.replace(offloading_config({}).groups[0], group_id=1, layer_names=("swa.0",)),)),
    "replicated layout": dict(replicated_layout=True),
    "canonical layout": dict(canonical_layout=True, kv_cache_layout="LBNHC"),
    "canonical family": dict(canonical_layout=True, kv_cache_layout="LBHNC"),
}


@pytest.mark.parametrize("agnostic", [False, True], ids=["exact-topology", "parallelism-agnostic"])
def test_the_namespace_separates_whatever_vllms_file_mapper_separates(agnostic):
    """Every pair of configs that vLLM's fs tier stores apart (FileMapper's
    directory and rank, as the fs tier builds it) gets two namespaces, and
    configs it stores together (parallel layouts collapsed where the bytes
    do not depend on them) get one."""
    base = replace(offloading_config(kvtier_entry()), parallel__is_parallelism_agnostic=agnostic)
    configs = {"base": base, **{name: replace(base, **change) for name, change in VARIANTS.items()}}

    def fs_place(config):
        mapper = FileMapper.from_offloading_spec("/root", spec_of(config),
                                                 blocks_per_file=config.cache.blocks_per_chunk,
                                                 parallel_agnostic=True)
        return mapper.base_path, mapper.rank

    fs = {name: fs_place(c) for name, c in configs.items()}
    ours = {name: identity.vllm_namespace(spec_of(c)) for name, c in configs.items()}
    for a in configs:
        for b in configs:
            if fs[a] != fs[b]:
                assert ours[a] != ours[b], (a, b, ours[a])
            else:
                assert ours[a] == ours[b], (a, b, ours[a], ours[b])
    if agnostic:  # the parallel layout is collapsed, as the fs tier does
        assert ours["tp size"] == ours["pp size"] == ours["rank"] == ours["base"]
    else:
        assert len({ours[n] for n in ("tp size", "pp size", "pcp size", "dcp size", "rank")}) == 5


def test_the_kv_cache_layout_separates_too():
    """Beyond FileMapper: the direct layout's bytes follow the worker's KV
    layout, which FileMapper leaves out."""
    base = offloading_config(kvtier_entry())
    names = {identity.vllm_namespace(spec_of(replace(base, kv_cache_layout=layout)))
             for layout in (None, "LBNHC", "LBHNC")}
    assert len(names) == 3


def test_the_user_namespace_is_added_never_instead(tmp_path, caplog):
    engine = Engine(kvtier_entry(backend="disk", path=str(tmp_path), namespace="weights-v2"))
    try:
        derived = identity.vllm_namespace(engine.spec)
        assert derived.startswith("vllm/org-model-a/float16/t16/tp1pp1/r0/")
        assert engine.tier.namespace == derived + "/weights-v2"
        assert engine.tier.config_info()["kvtier_namespace"] == engine.tier.namespace
    finally:
        engine.close()
    with caplog.at_level(logging.INFO):
        plain = Engine(kvtier_entry(backend="disk", path=str(tmp_path)))
    try:
        assert plain.tier.namespace == derived
        # The adapter's INFO line names it, for the operator comparing engines.
        assert any(f"namespace {derived!r}" in r.getMessage() for r in caplog.records), caplog.text
    finally:
        plain.close()


def test_a_spec_without_a_config_derives_nothing(tmp_path):
    """Tests' stand-in specs and vLLM before 0.33: an owned tier works as
    before, with the user's namespace or none."""
    arr = np.zeros((4, 4096), dtype=np.uint8)
    for cfg, want in (({}, ""), ({"backend": "disk", "path": str(tmp_path / "a")}, ""),
                      ({"backend": "disk", "path": str(tmp_path / "b"), "namespace": "mine"}, "mine")):
        tier = KVTierSecondaryTier(bare_spec(), memoryview(arr), "KVTierSecondaryTier",
                                   capacity_bytes="1MiB", io_threads=1, **cfg)
        assert tier.namespace == want
        tier.shutdown()


@pytest.mark.parametrize("sharing", ["disk", "redis"])
def test_a_shared_tier_without_any_namespace_is_refused(tmp_path, request, sharing):
    """No config to derive from and no namespace: a shared store cannot tell
    whose blocks are whose, so the library refuses it (TIER_ERR_CONFIG)."""
    cfg = ({"backend": "disk", "path": str(tmp_path), "shared": True} if sharing == "disk" else
           {"backend": "redis", "url": request.getfixturevalue("redis_url"), "sharing": "shared"})
    arr = np.zeros((4, 4096), dtype=np.uint8)
    with pytest.raises(kvtier.KVTierError) as err:
        KVTierSecondaryTier(bare_spec(), memoryview(arr), "KVTierSecondaryTier", capacity_bytes="1MiB", **cfg)
    assert err.value.status == kvtier.TIER_ERR_CONFIG
    assert "namespace" in str(err.value)


@pytest.fixture(params=["disk", "redis", "redis-cluster"])
def shared_store(request, tmp_path):
    """The kvtier entry of a store a fleet shares."""
    if request.param == "disk":
        return kvtier_entry(backend="disk", path=str(tmp_path / "kv"), shared=True)
    url = request.getfixturevalue("redis_url" if request.param == "redis" else "redis_cluster_url")
    return kvtier_entry(backend="redis", url=url, sharing="shared", key_prefix=f"t{time.monotonic_ns()}",
                        locality="REMOTE")


def test_only_an_engine_of_the_same_identity_gets_the_blocks(shared_store):
    keys = block_keys(TOKENS)
    rows = payload(len(keys), seed=7)
    writer = Engine(shared_store)
    try:
        writer.store(keys, rows)
    finally:
        writer.close()
    wrong = []
    for what, change in (("another model", dict(model="org/model-a-ft")), ("another dtype", dict(dtype="bfloat16")),
                         ("another TP size", dict(tp=2)), ("other layer names", dict(layers=("model.layers.0.attn",
                                                                                             "model.layers.9.attn")))):
        other = Engine(shared_store, **change)
        try:
            got, loaded = other.fetch(keys)
            if got != [MISS] * len(keys) or loaded is not None or other.tier.stats().loads_ok:
                wrong.append((what, got, other.tier.namespace))
        finally:
            other.close()
    assert not wrong, f"engines of another identity were served these blocks: {wrong}"
    same = Engine(shared_store)
    try:
        got, loaded = same.fetch(keys)
        assert got == [HIT] * len(keys)
        assert loaded is not None and loaded.tobytes() == rows.tobytes()
        assert same.tier.stats().loads_ok >= 1
    finally:
        same.close()


def test_no_mirror_hit_outlives_another_processs_clear(shared_store):
    """The adapter answers lookups from its presence mirror, which only the
    library's events change. On shared storage a mirror HIT is given only
    within one lease of a library answer, so once another tier of the
    namespace has cleared it (clear() returns two leases after raising the
    generation) this engine's next lookup is no HIT, and it settles MISS."""
    from vllm.v1.kv_offload.base import ReqContext

    entry = dict(shared_store, probe_ttl_ms=100)
    engine = Engine(entry)
    clearer_config = {k: v for k, v in entry.items() if k not in ("type", "module_path", "locality")}
    clearer_config["namespace"] = engine.tier.namespace
    rows = np.zeros((2, ROW), dtype=np.uint8)
    try:
        with kvtier.Tier(rows, **clearer_config) as clearer:
            [key] = block_keys(TOKENS[:16])
            clearer.submit_store(1, [key], [0])
            clearer.drain()
            assert clearer.poll()[0].ok
            ctx = ReqContext("r")
            deadline = time.monotonic() + 10
            while engine.tier.lookup(key, ctx) is not HIT:
                assert time.monotonic() < deadline
                engine.tier.get_finished_jobs()
                time.sleep(0.01)
            # Answered by the mirror from now on, without asking the library.
            assert engine.tier.lookup(key, ctx) is HIT
            clearer.clear()
            assert engine.tier.lookup(key, ctx) is not HIT
            deadline = time.monotonic() + 10
            while (answer := engine.tier.lookup(key, ctx)) is not MISS:
                assert answer is not HIT and time.monotonic() < deadline
                engine.tier.get_finished_jobs()
                time.sleep(0.01)
    finally:
        engine.close()
