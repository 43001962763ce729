#!/usr/bin/env bash
# Runs every test (C/C++ through the real library, ASan/UBSan, valgrind when
# installed, the C++ wrapper, header checks, install and consumer builds, the
# Rust tests, the benchmark smoke test) on a fresh machine that has cargo, a
# C/C++ compiler and python3. Installs cmake, pkg-config, redis-server and
# abigail-tools (abidw, abidiff: the ABI check) if they are missing.
#
# Environment: BUILD_DIR (default build), JOBS (parallel builds and tests, default 2).
# Under CI (CI=true) it exports KVTIER_REQUIRE_REDIS=1: the Redis tests then
# fail, instead of skipping, when redis-server is missing.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-2}

# Runs a command as root (directly, or through sudo if that exists), without prompts.
as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        env DEBIAN_FRONTEND=noninteractive "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo env DEBIAN_FRONTEND=noninteractive "$@"
    else
        return 1
    fi
}

install_cmake() {
    echo "test.sh: cmake not found; installing it" >&2
    if command -v apt-get >/dev/null 2>&1; then
        if as_root apt-get install -y cmake || { as_root apt-get update && as_root apt-get install -y cmake; }; then
            return 0
        fi
    fi
    echo "test.sh: apt-get could not install cmake; trying pip" >&2
    python3 -m pip install --user cmake || python3 -m pip install --user --break-system-packages cmake
    PATH="$(python3 -m site --user-base)/bin:$PATH"
    export PATH
}

# The consumer_pkgconfig tests build against the installed kvtier.pc; without
# pkg-config they fail (they do not skip).
install_pkg_config() {
    echo "test.sh: pkg-config not found; installing it" >&2
    if command -v apt-get >/dev/null 2>&1; then
        as_root apt-get install -y pkg-config || { as_root apt-get update && as_root apt-get install -y pkg-config; } ||
            echo "test.sh: apt-get could not install pkg-config" >&2
    fi
}

# The Redis tests (tests/redis_harness.rs, the redis backend's) start their own
# redis-server processes on 127.0.0.1; the package brings redis-cli along.
install_redis_server() {
    echo "test.sh: redis-server not found; installing it" >&2
    if command -v apt-get >/dev/null 2>&1; then
        as_root apt-get install -y redis-server ||
            { as_root apt-get update && as_root apt-get install -y redis-server; } ||
            echo "test.sh: apt-get could not install redis-server" >&2
    fi
}

# The ABI check (abi_check, c_tests/abi/) compares the library with the
# committed baseline through abidiff; under CI=true it fails without it.
install_abigail_tools() {
    echo "test.sh: abidw/abidiff not found; installing abigail-tools" >&2
    if command -v apt-get >/dev/null 2>&1; then
        as_root apt-get install -y abigail-tools ||
            { as_root apt-get update && as_root apt-get install -y abigail-tools; } ||
            echo "test.sh: apt-get could not install abigail-tools" >&2
    fi
}

if ! command -v cmake >/dev/null 2>&1 || ! command -v ctest >/dev/null 2>&1; then
    install_cmake
fi
if ! command -v pkg-config >/dev/null 2>&1 && ! command -v pkgconf >/dev/null 2>&1; then
    install_pkg_config
fi
if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
    install_redis_server
fi
if ! command -v abidw >/dev/null 2>&1 || ! command -v abidiff >/dev/null 2>&1; then
    install_abigail_tools
fi
# In CI a missing server is a failure, never a skip. ctest passes its
# environment on to the tests (rust_tests runs cargo test under it).
if [ "${CI:-}" = "true" ]; then
    export KVTIER_REQUIRE_REDIS=1
fi
cmake --version | sed -n 1p
if command -v redis-server >/dev/null 2>&1; then
    redis-server --version
else
    echo "test.sh: no redis-server: the Redis tests skip${KVTIER_REQUIRE_REDIS:+ (KVTIER_REQUIRE_REDIS is set: they fail)}" >&2
fi

cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release
cmake --build "$BUILD_DIR" -j "$JOBS"
# `ctest --test-dir` needs cmake >= 3.20; running from the build directory works everywhere.
cd "$BUILD_DIR"
ctest --output-on-failure -j "$JOBS"
