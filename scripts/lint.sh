#!/usr/bin/env bash
# The house's style gates, as CTest's rust.lint runs them: rustfmt's layout,
# clippy with zero warnings on every target with the test seams, and the
# lean build (no Redis backend) with zero warnings too.
#
#   scripts/lint.sh [TARGET_DIR]   # default target/lint: its own, so the
#                                  # release builds the tests run are untouched
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
target="${1:-target/lint}"
cargo fmt --all --check
cargo clippy --workspace --all-targets --features kvtier/test-hooks --target-dir "$target" -- -D warnings
cargo clippy -p kvtier --lib --no-default-features --target-dir "$target" -- -D warnings
echo "lint.sh: fmt and clippy clean (all targets; and without default features)"
