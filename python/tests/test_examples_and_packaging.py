"""The examples run, the library is found where the setup says, setup.py
refuses to package what it must not, the `kvtier` console script's shim
says when the command is missing, and (opt-in, KVTIER_TEST_PACKAGING=1)
`pip install ./python` into a fresh venv works, console script included."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from child import child_env

import kvtier

PYTHON_DIR = Path(__file__).resolve().parent.parent
REPO = PYTHON_DIR.parent
EXAMPLES = REPO / "examples"


def test_library_found_where_expected():
    env = os.environ.get("KVTIER_LIBRARY")
    if env:
        assert kvtier.library_path == Path(env)
    elif os.environ.get("KVTIER_TEST_INSTALLED") == "1":
        assert kvtier.library_path.parent == Path(kvtier.__file__).resolve().parent
    else:
        assert kvtier.library_path.is_file()


def test_plain_python_example_runs():
    env = child_env()
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / "plain_python.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "bytes identical" in proc.stdout
    assert "TIER_ERR_OUT_OF_RANGE" in proc.stdout


def test_vllm_config_example_names_this_tier():
    config = json.loads((EXAMPLES / "vllm_config.json").read_text())
    extra = config["kv_connector_extra_config"]
    assert extra["spec_name"] == "TieringOffloadingSpec"
    [tier] = extra["secondary_tiers"]
    assert (tier["type"], tier["module_path"]) == ("KVTierSecondaryTier", "kvtier.vllm")
    try:
        from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory
    except Exception:
        return  # resolving the class needs vLLM; the adapter tests cover it
    from kvtier.vllm import KVTierSecondaryTier

    assert SecondaryTierFactory.get_tier_class(tier) is KVTierSecondaryTier


def setup_py_call(function: str, path: Path, env: dict) -> subprocess.CompletedProcess:
    """Calls `function(path)` of python/setup.py, loaded without building, in
    a child process."""
    code = (
        "import runpy; from pathlib import Path;"
        f"runpy.run_path({str(PYTHON_DIR / 'setup.py')!r}, run_name='kvtier_setup')"
        f"[{function!r}](Path({str(path)!r}))"
    )
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)


def test_setup_refuses_a_library_without_symbol_versions(tmp_path):
    # cargo's own libkvtier.so has no KVTIER_1 version node; CMake's has.
    plain = tmp_path / "libkvtier.so"
    plain.write_bytes(b"\x7fELF" + bytes(4096))
    proc = setup_py_call("checked", plain, dict(os.environ))
    assert proc.returncode != 0
    assert "has no KVTIER_ symbol versions" in proc.stderr, proc.stderr


def test_setup_without_cmake_fails_and_names_what_is_missing(tmp_path):
    # Nothing else is tried: an older build in target/release is never packaged.
    (tmp_path / "empty-bin").mkdir()
    env = dict(os.environ, PATH=str(tmp_path / "empty-bin"))
    proc = setup_py_call("cmake_built_library", tmp_path / "build", env)
    assert proc.returncode != 0
    assert "building from source needs cmake" in proc.stderr, proc.stderr
    assert not (tmp_path / "build").exists()


def test_setup_takes_the_kvtier_command_beside_the_library_or_refuses_a_missing_one(tmp_path):
    lib = tmp_path / "libkvtier.so.1"
    lib.write_bytes(b"\x7fELF")
    env = {k: v for k, v in os.environ.items() if k != "KVTIER_CLI"}
    (tmp_path / "kvtier").write_bytes(b"\x7fELF")
    proc = setup_py_call("bundled_cli", lib, env)
    assert proc.returncode == 0, proc.stderr
    # A named command that is not there fails the build: nothing else is packaged in its place.
    proc = setup_py_call("bundled_cli", lib, dict(env, KVTIER_CLI=str(tmp_path / "absent")))
    assert proc.returncode != 0 and "does not exist" in proc.stderr, proc.stderr


def test_console_script_without_the_command_says_so():
    code = "import kvtier._cli as c, pathlib; c.BINARY = pathlib.Path('/nonexistent/kvtier'); c.main()"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=child_env())
    assert proc.returncode == 127
    assert "this install has no kvtier command" in proc.stderr, proc.stderr


@pytest.mark.skipif(
    os.environ.get("KVTIER_TEST_PACKAGING") != "1",
    reason="packaging test is opt-in: KVTIER_TEST_PACKAGING=1 (creates a venv, needs PyPI)",
)
def test_pip_install_into_fresh_venv(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("KVTIER_LIBRARY", "PYTHONPATH")}
    subprocess.run(
        [str(py), "-m", "pip", "install", "--quiet", str(PYTHON_DIR)], check=True, env=env
    )
    code = (
        "import kvtier, pathlib;"
        "assert kvtier.library_path.parent == pathlib.Path(kvtier.__file__).parent, kvtier.library_path;"
        "assert b'\\0KVTIER_1\\0' in kvtier.library_path.read_bytes(), 'not the CMake-linked library';"
        "t = kvtier.Tier(bytearray(8192), block_bytes=4096, capacity_bytes=8192);"
        "t.submit_store(1, [b'k'], [0]); t.drain(); assert t.poll()[0].ok; t.close();"
        "import kvtier.vllm; print('ok')"
    )
    proc = subprocess.run(
        [str(py), "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
    # The kvtier command CMake built beside the library, through the console script.
    proc = subprocess.run([str(venv / "bin" / "kvtier"), "--help"], env=env, capture_output=True, text=True)
    assert proc.returncode == 0 and "inspect" in proc.stdout, proc.stderr
