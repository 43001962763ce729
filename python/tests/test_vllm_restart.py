"""A vLLM engine's memory tier survives the engine's death (issue 56): an
engine process builds kvtier through vLLM's own factory
(``TieringOffloadingSpec``, ``vllm_engine.Engine``) with ``persist_path`` on
/dev/shm, stores a prompt's blocks, keeps storing others, and is SIGKILLed;
a new engine process of the same model gets the blocks as hits through
vLLM's lookup and load, byte-exact. The adapter passes ``persist_path``
through like any kvtier key; nothing else is set.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent
PYTHON_DIR = TESTS_DIR.parent

try:
    from vllm_engine import ROW  # noqa: F401
except Exception as exc:  # ImportError, or a vLLM that fails to import
    pytest.skip(f"vLLM 0.33 is not importable ({exc!r})", allow_module_level=True)

# A prompt of five full blocks, then prompts of four stored one after the
# other until the engine is killed (their tokens never overlap).
FIRST = list(range(5000, 5000 + 5 * 16))


def later(i: int) -> list[int]:
    return list(range(20000 + 1000 * i, 20000 + 1000 * i + 4 * 16))


ENGINE = textwrap.dedent(
    r'''
    import json, sys
    from vllm_engine import Engine, block_keys, payload

    role, tier = sys.argv[1], json.loads(sys.argv[2])
    first = json.loads(sys.argv[3])
    def later(i):
        return list(range(20000 + 1000 * i, 20000 + 1000 * i + 4 * 16))

    engine = Engine(tier)
    # vLLM's own primary buffer is a file too, which a killed engine leaves.
    print(f"REGION /dev/shm/vllm_offload_{engine.spec._engine_id}.mmap", flush=True)
    print("NAMESPACE " + engine.tier.namespace, flush=True)
    found = engine.tier.stats().num_blocks  # before any store or load
    if role == "store":
        engine.store(block_keys(first), payload(5, seed=11))
        print("STORED first", flush=True)
        for i in range(1, 1_000_000):  # until killed
            engine.store(block_keys(later(i)), payload(4, seed=100 + i))
            print(f"STORED {i}", flush=True)
    else:
        out = {}
        got, rows = engine.fetch(block_keys(first))
        out["first"] = {"got": [g.name for g in got],
                        "exact": rows is not None and rows.tobytes() == payload(5, seed=11).tobytes()}
        for i in json.loads(sys.argv[4]):
            keys = block_keys(later(i))
            got, rows = engine.fetch(keys)
            want = payload(4, seed=100 + i)
            hits = [j for j, g in enumerate(got) if g.name == "HIT"]
            out[str(i)] = {"got": [g.name for g in got],
                           "exact": rows is None or rows.tobytes() == want[hits].tobytes()}
        stats = engine.tier.stats()
        out["num_blocks"] = stats.num_blocks
        out["loads_ok"] = stats.loads_ok
        out["found"] = found
        print("RESULT " + json.dumps(out), flush=True)
        engine.close()
    '''
)


def engine(tmp_path: Path, role: str, tier: dict, *extra: str) -> subprocess.Popen:
    script = tmp_path / "engine.py"
    script.write_text(ENGINE)
    env = dict(os.environ)
    env.pop("PYTHONHASHSEED", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PYTHON_DIR), str(TESTS_DIR), env.get("PYTHONPATH")]))
    return subprocess.Popen(
        [sys.executable, str(script), role, json.dumps(tier), json.dumps(FIRST), *extra],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


@pytest.fixture
def shm_dir():
    path = Path("/dev/shm") / f"kvtier-test-vllm-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    yield path
    # An arena on tmpfs is memory: never leave one behind.
    subprocess.run(["rm", "-rf", str(path)], check=False)


def test_the_memory_tier_survives_a_sigkilled_engine(tmp_path, shm_dir):
    tier = {"type": "KVTierSecondaryTier", "module_path": "kvtier.vllm", "capacity_bytes": "16MiB",
            "io_threads": 2, "persist_path": str(shm_dir)}
    first = engine(tmp_path, "store", tier)
    lines = []
    try:
        # Killed while it stores its third later prompt, or in the middle of it.
        for line in first.stdout:
            lines.append(line.strip())
            if line.startswith("STORED 2"):
                break
        else:
            pytest.fail(f"the first engine stopped early:\n{lines}\n{first.stderr.read()[-4000:]}")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)
        for line in lines:
            if line.startswith("REGION /dev/shm/vllm_offload_"):
                Path(line.split(" ", 1)[1]).unlink(missing_ok=True)
    assert first.returncode == -signal.SIGKILL
    namespace = next(line for line in lines if line.startswith("NAMESPACE ")).split(" ", 1)[1]
    assert namespace.startswith("vllm/"), namespace
    assert len(list(shm_dir.glob("*.arena"))) == 1

    second = engine(tmp_path, "fetch", tier, json.dumps([1, 2, 3]))
    out, err = second.communicate(timeout=300)
    results = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert second.returncode == 0 and results, f"{out}\n{err[-4000:]}"
    got = json.loads(results[-1][len("RESULT "):])
    assert f"NAMESPACE {namespace}" in out, "a restarted engine derives the same namespace"
    # The new tier found every block the dead one reported stored.
    assert got["found"] >= 13, got
    # What the engine stored before it died: hits through vLLM, byte-exact.
    assert got["first"] == {"got": ["HIT"] * 5, "exact": True}, got
    for i in ("1", "2"):
        assert got[i] == {"got": ["HIT"] * 4, "exact": True}, (i, got)
    # The prompt it was storing when it died: whatever is a hit is exact.
    assert got["3"]["exact"], got
    assert got["num_blocks"] >= 13 and got["loads_ok"] >= 3, got
