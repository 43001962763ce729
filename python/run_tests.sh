#!/usr/bin/env bash
# Runs the Python tests (binding, and the vLLM adapter when vLLM is importable).
#
#   python/run_tests.sh [pytest args...]
#
# Environment:
#   KVTIER_PYTHON   interpreter to test with (e.g. /tmp/vllm-env/bin/python, to
#                   run the adapter tests against vLLM); it needs pytest and numpy,
#                   and prometheus_client for the metrics test.
#                   Default: the engines' environment (scripts/engine_env.sh:
#                   vLLM and the test packages) when it is complete, else a venv
#                   at <repo>/build/pyenv without vLLM (the adapter tests
#                   skip), created on first use. Under CI=true the engines'
#                   environment, built if absent; there a skip is a failure
#                   (tests/conftest.py) and the packaging test runs.
#   KVTIER_LIBRARY  the library to test; default <repo>/target/release/libkvtier.so,
#                   built with cargo if missing.
#   KVTIER_REDIS_HARNESS  the redis-server launcher the Redis fixtures run
#                   (redis-harness/); default <repo>/target/release/kvtier-redis-harness,
#                   built with cargo if missing.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"

if [[ -z "${KVTIER_LIBRARY:-}" ]]; then
    export KVTIER_LIBRARY="$repo/target/release/libkvtier.so"
    if [[ ! -f "$KVTIER_LIBRARY" ]]; then
        echo "run_tests.sh: building $KVTIER_LIBRARY" >&2
        (cd "$repo" && cargo build --release --lib)
    fi
fi

if [[ -z "${KVTIER_REDIS_HARNESS:-}" ]]; then
    export KVTIER_REDIS_HARNESS="$repo/target/release/kvtier-redis-harness"
    if [[ ! -x "$KVTIER_REDIS_HARNESS" ]]; then
        echo "run_tests.sh: building $KVTIER_REDIS_HARNESS" >&2
        (cd "$repo" && cargo build --release -p kvtier-redis-harness)
    fi
fi

if [[ -n "${KVTIER_PYTHON:-}" ]]; then
    py="$KVTIER_PYTHON"
elif [[ "${CI:-}" == "true" ]]; then
    py="$(bash "$repo/scripts/engine_env.sh")"
elif py="$(bash "$repo/scripts/engine_env.sh" --check)"; then
    echo "run_tests.sh: testing with the engines' environment, $py" >&2
else
    venv="$repo/build/pyenv"
    py="$venv/bin/python"
    # prometheus_client: its text parser reads Tier.metrics() in test_observe.py;
    # setuptools: the packaging tests load python/setup.py (venvs of Python 3.12 lack it).
    if ! "$py" -c "import pytest, numpy, prometheus_client, setuptools" 2>/dev/null; then
        echo "run_tests.sh: setting up $venv" >&2
        python3 -m venv "$venv"
        "$py" -m pip install --quiet --disable-pip-version-check pytest numpy prometheus_client setuptools
    fi
fi

if [[ "${CI:-}" == "true" ]]; then
    # Nothing skips in CI: the opt-in pip-install test too (PyPI is reachable there).
    export KVTIER_TEST_PACKAGING="${KVTIER_TEST_PACKAGING:-1}"
fi

cd "$here"
exec "$py" -m pytest -p no:cacheprovider "$@"  # paths default to tests/ (pytest.ini)
