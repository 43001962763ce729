#!/usr/bin/env bash
# Runs every test (C/C++ through the real library, ASan/UBSan, valgrind, the
# C++ wrapper, header checks, install and consumer builds, the Rust tests, the
# benchmark smoke tests, the Python binding, the vLLM and SGLang adapters, and
# the wheel installed where there is no cargo) on a fresh machine that has
# cargo, a C/C++ compiler and python3 (README.md, "Requirements"). Installs cmake,
# pkg-config, redis-server, abigail-tools (abidw, abidiff: the ABI check),
# valgrind and mount if they are missing, and makes /dev/fuse if it can.
#
# Environment: BUILD_DIR (default build), JOBS (parallel builds and tests, default 2).
# Under CI (CI=true) no test may skip: a test whose tool is missing fails, and
# the engines' environment (vLLM, scripts/engine_env.sh) is built if absent,
# beside the build, and the Python tests run in it.
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

# apt_install <package> <why>: installs a Debian package, or says it could not.
apt_install() {
    echo "test.sh: installing $1 ($2)" >&2
    if command -v apt-get >/dev/null 2>&1; then
        as_root apt-get install -y "$1" || { as_root apt-get update && as_root apt-get install -y "$1"; } ||
            echo "test.sh: apt-get could not install $1" >&2
    else
        echo "test.sh: no apt-get to install $1" >&2
    fi
}

# The Redis tests (tests/redis_harness.rs, the redis backend's) start their own
# redis-server processes on 127.0.0.1; the package brings redis-cli along.
install_redis_server() {
    apt_install redis-server "the Redis tests start their own servers"
}

# The ABI check (abi_check, c_tests/abi/) compares the library with the
# committed baseline through abidiff; under CI=true it fails without it.
install_abigail_tools() {
    apt_install abigail-tools "the ABI check compares the library with its baseline"
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
# valgrind_contract and valgrind_wrapper (c_tests/CMakeLists.txt).
if ! command -v valgrind >/dev/null 2>&1; then
    apt_install valgrind "the valgrind tests"
fi
# The O_DIRECT fallback test (tests/disk.rs) runs mount -t ramfs and umount.
if ! command -v mount >/dev/null 2>&1 || ! command -v umount >/dev/null 2>&1; then
    apt_install mount "the O_DIRECT fallback test mounts a ramfs"
fi
# The hung-mount tests (tests/disk_deadline.rs) call mount(2) with a /dev/fuse
# descriptor they never serve: they need the fuse module's device, no FUSE
# library or fusermount.
if [ ! -e /dev/fuse ]; then
    echo "test.sh: no /dev/fuse; loading the fuse module" >&2
    if ! command -v modprobe >/dev/null 2>&1; then
        apt_install kmod "modprobe, for the fuse module"
    fi
    as_root modprobe fuse || as_root mknod -m 0666 /dev/fuse c 10 229 ||
        echo "test.sh: could not make /dev/fuse: the hung-mount tests cannot run" >&2
fi
# In CI a missing tool is a failure, never a skip (the tests also read CI=true
# themselves). ctest passes its environment on to the tests.
if [ "${CI:-}" = "true" ]; then
    export KVTIER_REQUIRE_REDIS=1
fi
cmake --version | sed -n 1p
if command -v redis-server >/dev/null 2>&1; then
    redis-server --version
else
    echo "test.sh: no redis-server: the Redis tests skip${KVTIER_REQUIRE_REDIS:+ (KVTIER_REQUIRE_REDIS is set: they fail)}" >&2
fi

mkdir -p "$BUILD_DIR"
engine_pid=
if [ "${CI:-}" = "true" ] && [ -z "${KVTIER_PYTHON:-}" ]; then
    # vLLM's install is mostly download, the build all CPU: side by side.
    echo "test.sh: ensuring the engines' environment (log: $BUILD_DIR/engine_env.log)" >&2
    bash scripts/engine_env.sh >"$BUILD_DIR/engine_env.path" 2>"$BUILD_DIR/engine_env.log" &
    engine_pid=$!
fi

cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release
cmake --build "$BUILD_DIR" -j "$JOBS"

if [ -n "$engine_pid" ]; then
    if ! wait "$engine_pid"; then
        cat "$BUILD_DIR/engine_env.log" >&2
        echo "test.sh: scripts/engine_env.sh failed" >&2
        exit 1
    fi
    tail -n 3 "$BUILD_DIR/engine_env.log" >&2
    KVTIER_PYTHON="$(cat "$BUILD_DIR/engine_env.path")"
    export KVTIER_PYTHON
    echo "test.sh: the Python tests run with $KVTIER_PYTHON" >&2
fi

# `ctest --test-dir` needs cmake >= 3.20; running from the build directory works everywhere.
cd "$BUILD_DIR"
ctest --output-on-failure -j "$JOBS"
