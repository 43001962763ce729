#!/usr/bin/env bash
# The house's style gates. Rust (CTest's rust.lint): rustfmt's layout, clippy
# with zero warnings on every target with the test seams, and the lean build
# (no Redis backend) with zero warnings too. Python (CTest's python_lint):
# ruff and mypy over python/kvtier, configured in python/pyproject.toml, at
# the versions pinned below, from a venv of their own.
#
#   scripts/lint.sh [--rust|--python] [TARGET_DIR]
#       both by default; TARGET_DIR (default target/lint) is the Rust
#       builds' own, so the release builds the tests run are untouched.
#
# Environment: KVTIER_LINT_VENV, the Python tools' venv (default
# build/lint-venv), made or completed on first use with pip. Where PyPI
# cannot be reached the Python half prints KVTIER-SKIP (CTest: skipped),
# except under CI=true, where that fails.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

RUFF_VERSION=0.17.5
MYPY_VERSION=2.4.1

which=all
case "${1:-}" in
    --rust) which=rust; shift ;;
    --python) which=python; shift ;;
esac
target="${1:-target/lint}"

lint_rust() {
    cargo fmt --all --check
    cargo clippy --workspace --all-targets --features kvtier/test-hooks --target-dir "$target" -- -D warnings
    cargo clippy -p kvtier --lib --no-default-features --target-dir "$target" -- -D warnings
    echo "lint.sh: fmt and clippy clean (all targets; and without default features)"
}

lint_python() {
    local venv="${KVTIER_LINT_VENV:-build/lint-venv}"
    local want="mypy==$MYPY_VERSION ruff==$RUFF_VERSION"
    if [[ "$("$venv/bin/python" -m pip freeze 2>/dev/null | grep -E '^(ruff|mypy)==' | sort | xargs)" != "$want" ]]; then
        echo "lint.sh: setting up $venv ($want)" >&2
        if ! { python3 -m venv "$venv" &&
            "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
                "ruff==$RUFF_VERSION" "mypy==$MYPY_VERSION"; }; then
            if [[ "${CI:-}" == "true" ]]; then
                echo "lint.sh: could not install $want from PyPI, and under CI=true nothing skips" >&2
                return 1
            fi
            echo "KVTIER-SKIP: could not install $want from PyPI: python/kvtier not linted"
            return 0
        fi
    fi
    # Caches in the venv: nothing is written into the source tree.
    (cd python && "$venv/bin/ruff" check --no-cache kvtier &&
        "$venv/bin/mypy" --cache-dir "$venv/mypy-cache" kvtier)
    echo "lint.sh: ruff and mypy clean (python/kvtier)"
}

if [[ "$which" != python ]]; then
    lint_rust
fi
if [[ "$which" != rust ]]; then
    # A relative venv path is the repository's, whatever the caller's directory.
    KVTIER_LINT_VENV="$(realpath -m "${KVTIER_LINT_VENV:-build/lint-venv}")"
    lint_python
fi
