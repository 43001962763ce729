#!/usr/bin/env bash
# CTest's python_wheel: builds the wheel (scripts/build_wheel.sh), installs it
# with pip alone into a fresh venv, and with a PATH that has no cargo runs the
# `kvtier` console script (the bundled command: --help, and inspect --json of
# a store the installed binding wrote), the binding's tests and imports the
# vLLM and SGLang adapters against the installed package.
#
#   scripts/test_wheel.sh SCRATCH [LIBRARY]
#
# LIBRARY: a libkvtier.so.1 CMake built, packaged instead of building one.
# The venv is made by the engines' interpreter (KVTIER_PYTHON; else
# scripts/engine_env.sh's, built under CI=true) and sees that environment's
# packages (vLLM, SGLang, pytest, numpy, prometheus_client) after its own, as
# --system-site-packages would for a system interpreter: the kvtier it
# imports is the wheel's. Without the engines' environment (outside CI) the
# venv gets pytest, numpy, prometheus_client and setuptools from PyPI and the adapters'
# part is skipped. Needs PyPI, so outside CI it runs only with
# KVTIER_TEST_PACKAGING=1.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
log() { echo "test_wheel.sh: $*" >&2; }

if [ "${CI:-}" != "true" ] && [ "${KVTIER_TEST_PACKAGING:-}" != "1" ]; then
    echo "KVTIER-SKIP: the wheel test is opt-in: KVTIER_TEST_PACKAGING=1 (it needs PyPI; CI runs it)"
    exit 0
fi
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
    echo "usage: scripts/test_wheel.sh SCRATCH [LIBRARY]" >&2
    exit 2
fi
scratch="$1"
rm -rf "$scratch"
mkdir -p "$scratch"
scratch="$(cd "$scratch" && pwd)"

wheel="$(KVTIER_LIBRARY="${2:-${KVTIER_LIBRARY:-}}" bash "$repo/scripts/build_wheel.sh" "$scratch/dist")"
case "$(basename "$wheel")" in
    kvtier-*-py3-none-manylinux_2_34_*.whl) ;;
    *) log "unexpected wheel name $wheel"; exit 1 ;;
esac

engines=
if [ -n "${KVTIER_PYTHON:-}" ]; then
    engines="$KVTIER_PYTHON"
elif [ "${CI:-}" = "true" ]; then
    engines="$(bash "$repo/scripts/engine_env.sh")"
elif ! engines="$(bash "$repo/scripts/engine_env.sh" --check)"; then
    engines=
fi

venv="$scratch/venv"
if [ -n "$engines" ]; then
    "$engines" -m venv "$venv"
    site_dir="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    # addsitedir also runs that environment's own .pth files, as a site directory's.
    "$engines" -c 'import site; [print(f"import site; site.addsitedir({p!r})") for p in site.getsitepackages()]' \
        >"$site_dir/kvtier-engines.pth"
else
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check pytest numpy prometheus_client setuptools
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-index --no-deps "$wheel"

# The tests' PATH: the venv's, then every directory of ours without cargo.
path="$venv/bin"
IFS=: read -r -a dirs <<<"$PATH"
for dir in "${dirs[@]}"; do
    if [ -n "$dir" ] && [ ! -x "$dir/cargo" ]; then
        path="$path:$dir"
    fi
done
run() {
    (cd "$scratch" && env -u KVTIER_LIBRARY -u PYTHONPATH -u CARGO_HOME -u RUSTUP_HOME \
        PATH="$path" KVTIER_TEST_INSTALLED=1 "$@")
}
if run sh -c 'command -v cargo'; then
    log "cargo is still on the tests' PATH"
    exit 1
fi

run "$venv/bin/python" - <<'EOF'
import importlib.metadata, pathlib
import kvtier

installed = pathlib.Path(kvtier.__file__).parent
assert kvtier.library_path == installed / "libkvtier.so", kvtier.library_path
versions = {importlib.metadata.version("kvtier"), kvtier.__version__, kvtier.library_version()}
assert len(versions) == 1, versions
print(f"test_wheel.sh: kvtier {kvtier.__version__} from {installed}")
EOF
symbols="$(readelf --dyn-syms --wide "$(run "$venv/bin/python" -c 'import kvtier; print(kvtier.library_path)')")"
grep -q ' tier_new@@KVTIER_1' <<<"$symbols" || { log "the installed library has no KVTIER_1 symbol versions"; exit 1; }

# The console script is the venv's and runs the bundled command, which reads
# a store the installed binding wrote (one 4 KiB block in namespace "m").
[ "$(run sh -c 'command -v kvtier')" = "$venv/bin/kvtier" ] || { log "no kvtier console script in $venv/bin"; exit 1; }
help="$(run kvtier --help)" || { log "kvtier --help failed"; exit 1; }
grep -q 'inspect' <<<"$help" || { log "kvtier --help does not list inspect: $help"; exit 1; }
run "$venv/bin/python" - "$scratch/store" <<'EOF'
import json, subprocess, sys, time
import kvtier

store = sys.argv[1]
buf = bytearray(4096 * 2)
with kvtier.Tier(buf, block_bytes=4096, backend="disk", path=store, capacity_bytes=1 << 20, namespace="m") as tier:
    tier.submit_store(1, [b"k" * 16], [0])
    deadline = time.monotonic() + 30
    done = []
    while not done:
        assert time.monotonic() < deadline, "the store job did not finish"
        tier.wait(1.0)
        done = tier.poll()
    assert done[0].ok, done
out = subprocess.run(["kvtier", "inspect", store, "--json"], check=True, capture_output=True, text=True).stdout
report = json.loads(out)
assert report["blocks"] == 1 and report["bytes"] >= 4096, report
[ns] = report["namespaces"]
assert ns["blocks"] == 1, ns
print(f"test_wheel.sh: kvtier inspect --json through the console script: {report['blocks']} block")
EOF

# The binding's tests; the pip-install test builds from source, which is not this test's business.
tests="$repo/python/tests"
run "$venv/bin/python" -m pytest -p no:cacheprovider -q --rootdir "$repo/python" -c "$repo/python/pytest.ini" \
    "$tests/test_binding.py" "$tests/test_abi.py" "$tests/test_observe.py" "$tests/test_prom.py" \
    "$tests/test_examples_and_packaging.py" -k "not test_pip_install_into_fresh_venv"

if [ -z "$engines" ]; then
    echo "KVTIER-SKIP: the adapters' imports need the engines' environment (scripts/engine_env.sh); the binding passed"
    exit 0
fi
run "$venv/bin/python" - <<'EOF'
import pathlib
import kvtier
import lmcache
import sglang
import vllm
from kvtier.lmcache import KVTierL2Adapter
from kvtier.sglang import KVTierStorage
from lmcache.v1.distributed.l2_adapters.base import L2AdapterInterface
from kvtier.vllm import KVTierSecondaryTier
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage
from vllm.v1.kv_offload.tiering.base import SecondaryTierManager
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory

installed = pathlib.Path(kvtier.__file__).parent
for module in (kvtier.vllm, kvtier.sglang, kvtier.lmcache):
    assert pathlib.Path(module.__file__).parent == installed, module.__file__
entry = {"type": "KVTierSecondaryTier", "module_path": "kvtier.vllm"}
assert SecondaryTierFactory.get_tier_class(entry) is KVTierSecondaryTier
assert issubclass(KVTierSecondaryTier, SecondaryTierManager)
assert issubclass(KVTierStorage, HiCacheStorage)
assert issubclass(KVTierL2Adapter, L2AdapterInterface)
print(f"test_wheel.sh: kvtier.vllm with vLLM {vllm.__version__}, kvtier.sglang with SGLang {sglang.__version__}, "
      f"kvtier.lmcache with LMCache {lmcache.__version__}")
EOF
log "the wheel installs and passes without cargo: $(basename "$wheel")"
