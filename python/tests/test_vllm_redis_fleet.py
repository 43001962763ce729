"""A fleet of vLLM engines on one shared store (issue 53): each engine is its
own process with vLLM's own offloading side (a real ``OffloadingConfig``,
``TieringOffloadingSpec.get_manager()``, kvtier built by vLLM's factory) and
keys from vLLM's own block hashing of the same prompt token ids (the engine
core's ``init_none_hash`` and ``get_request_block_hasher``, sha256, no
``PYTHONHASHSEED``). The second engine of the same model gets the first one's
blocks as hits, byte-exact, and counts them in its metrics; a third, of
another model, computes the very same keys and gets none.

Each engine process uses a shared Redis server, a shared Redis Cluster and
a shared disk directory in turn (one vLLM import per engine). CI runs it (``python/run_tests.sh`` in the engines' venv, with
redis-server installed by ``scripts/test.sh``); under ``CI=true`` a missing
vLLM or redis-server fails it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent
PYTHON_DIR = TESTS_DIR.parent

try:
    from vllm_engine import ROW, block_keys
except Exception as exc:  # ImportError, or a vLLM that fails to import
    pytest.skip(f"vLLM 0.33 is not importable ({exc!r})", allow_module_level=True)

TOKENS = list(range(5000, 5000 + 5 * 16))  # five full blocks of a prompt

ENGINE = textwrap.dedent(
    r'''
    import json, sys
    from vllm_engine import Engine, block_keys, payload

    role, model, stores = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    tokens = json.loads(sys.argv[4])
    keys = block_keys(tokens)  # what this engine's scheduler would make
    results = {}
    for name, tier in stores.items():  # one engine per store: vLLM imports once
        engine = Engine(tier, model=model)
        try:
            out = {"keys": [k.hex() for k in keys], "namespace": engine.tier.namespace}
            if role == "store":
                engine.store(keys, payload(len(keys), seed=11))
                out["stores_ok"] = engine.tier.stats().stores_ok
            else:
                got, rows = engine.fetch(keys)
                out["got"] = [g.name for g in got]
                out["exact"] = rows is not None and rows.tobytes() == payload(len(keys), seed=11).tobytes()
                out["loads_ok"] = engine.tier.stats().loads_ok
                # What an operator reads on /metrics (docs/sharing.md).
                data = engine.tier.get_stats().data["data"]
                out["hits"] = sum(data["vllm:kv_offload_kvtier_lookup_hits"].values())
                out["loaded_bytes"] = sum(data["vllm:kv_offload_kvtier_loaded_bytes"].values())
            results[name] = out
        finally:
            engine.close()
    print("RESULT " + json.dumps(results))
    '''
)


def run_engine(tmp_path: Path, role: str, model: str, stores: dict) -> dict:
    """One engine process: for each store, {"keys", "namespace", ...}."""
    script = tmp_path / "engine.py"
    script.write_text(ENGINE)
    env = dict(os.environ)
    # An operator's default: vLLM seeds sha256 block hashes with its fixed seed.
    env.pop("PYTHONHASHSEED", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PYTHON_DIR), str(TESTS_DIR), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, str(script), role, model, json.dumps(stores), json.dumps(TOKENS)],
        env=env, capture_output=True, text=True, timeout=300,
    )
    results = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and results, (
        f"{role} ({model}) failed ({done.returncode}):\n{done.stdout}\n{done.stderr[-4000:]}"
    )
    return json.loads(results[-1][len("RESULT "):])


def test_engines_of_one_model_share_a_prefix_and_another_model_gets_none(tmp_path, redis_url,
                                                                         redis_cluster_url):
    common = {"type": "KVTierSecondaryTier", "module_path": "kvtier.vllm", "capacity_bytes": "4MiB",
              "io_threads": 2, "probe_ttl_ms": 10}
    redis = dict(common, backend="redis", sharing="shared", locality="REMOTE", key_prefix="fleet")
    stores = {
        "redis": dict(redis, url=redis_url),
        "redis-cluster": dict(redis, url=redis_cluster_url),
        "disk": dict(common, backend="disk", path=str(tmp_path / "kv"), shared=True),
    }
    first = run_engine(tmp_path, "store", "org/model-a", stores)
    second = run_engine(tmp_path, "fetch", "org/model-a", stores)
    third = run_engine(tmp_path, "fetch", "org/model-b", stores)
    for name in stores:
        a, b, c = first[name], second[name], third[name]
        assert a["stores_ok"] >= 1, (name, a)
        # vLLM's hashing gives every process the same keys for the same tokens.
        assert len(a["keys"]) == 5 and a["keys"] == b["keys"] == c["keys"], name
        assert b["namespace"] == a["namespace"] != c["namespace"], name
        assert b["got"] == ["HIT"] * 5 and b["exact"], (name, b)
        assert b["loads_ok"] >= 1 and b["hits"] >= 5 and b["loaded_bytes"] >= 5 * ROW, (name, b)
        assert c["got"] == ["MISS"] * 5 and not c["exact"], (name, c)
        assert c["loads_ok"] == 0 and c["hits"] == 0 and c["loaded_bytes"] == 0, (name, c)


def test_block_hashes_depend_on_the_seed_only_when_one_is_set(monkeypatch):
    """docs/sharing.md: with sha256 and no PYTHONHASHSEED every process hashes
    with vLLM's fixed seed (the processes above agree); a PYTHONHASHSEED
    replaces that seed, so a fleet setting one must set the same everywhere."""
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    default = block_keys(TOKENS)
    monkeypatch.setenv("PYTHONHASHSEED", "1")
    one = block_keys(TOKENS)
    assert block_keys(TOKENS) == one
    monkeypatch.setenv("PYTHONHASHSEED", "2")
    assert block_keys(TOKENS) != one
    monkeypatch.delenv("PYTHONHASHSEED")
    assert block_keys(TOKENS) == default != one
    assert block_keys(TOKENS, "sha256_cbor") != default  # another algorithm: other keys
