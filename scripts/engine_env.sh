#!/usr/bin/env bash
# Ensures the Python environment the engine adapters are tested in (vLLM,
# SGLang and LMCache) and prints its interpreter's path on stdout;
# everything else goes to stderr.
#
#   scripts/engine_env.sh           # reuse the environment, or build it (vLLM is ~10 GB)
#   scripts/engine_env.sh --check   # print the path if it is complete, else exit 1; installs nothing
#
# The environment lives outside the clone, so fresh clones (CI) share it:
#   KVTIER_ENGINE_VENV (default ${XDG_CACHE_HOME:-$HOME/.cache}/kvtier/engines-venv)
# It holds vllm==$KVTIER_VLLM_VERSION (0.33.0), what the Python tests need
# (pytest, numpy, prometheus_client), then python/requirements-engines-nodeps.txt
# (pip install --no-deps -r) and python/requirements-engines.txt (pip install -r),
# where those files exist (SGLang and LMCache come --no-deps over vLLM's
# packages). It is complete when vllm imports at that version, the LMCache
# pinned there imports, and a stamp written after the last install matches those inputs; otherwise
# the missing parts are installed (pip keeps what is already there).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${KVTIER_ENGINE_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kvtier/engines-venv}"
vllm_version="${KVTIER_VLLM_VERSION:-0.33.0}"
test_packages=(pytest numpy prometheus_client)
nodeps_reqs="$repo/python/requirements-engines-nodeps.txt"
reqs="$repo/python/requirements-engines.txt"
py="$venv/bin/python"
stamp="$venv/kvtier-engines.stamp"

log() { echo "engine_env.sh: $*" >&2; }

# What the environment must have been built from: a new requirements file (or
# a changed one) makes the stamp stale, so the next run installs it.
wanted_stamp() {
    echo "vllm==$vllm_version ${test_packages[*]}"
    for f in "$nodeps_reqs" "$reqs"; do
        if [ -f "$f" ]; then
            echo "$(basename "$f") $(sha256sum <"$f" | cut -d' ' -f1)"
        fi
    done
}

complete() {
    [ -x "$py" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$(wanted_stamp)" ] &&
        "$py" - "$vllm_version" <<'EOF' >/dev/null 2>&1
import sys
import numpy, prometheus_client, pytest, vllm
assert vllm.__version__ == sys.argv[1], vllm.__version__
EOF
}

# The stamp already covers the pinned LMCache; this checks that it imports.
lmcache_ok() {
    local want
    want="$(sed -n 's/^lmcache==//p' "$nodeps_reqs" 2>/dev/null)"
    [ -z "$want" ] && return 0
    "$py" - "$want" <<'EOF' >/dev/null 2>&1
import sys
from importlib.metadata import version
assert version("lmcache") == sys.argv[1]
import lmcache.v1.distributed.l2_adapters.plugin_l2_adapter
EOF
}

if [ "${1:-}" = "--check" ]; then
    complete && lmcache_ok && { echo "$py"; exit 0; }
    exit 1
fi

mkdir -p "$(dirname "$venv")"
# One install at a time per environment (two CI jobs on one cache).
exec 9>"$venv.lock"
flock 9

if complete && lmcache_ok; then
    log "reusing $venv (vllm $vllm_version)"
    echo "$py"
    exit 0
fi

if [ ! -x "$py" ]; then
    log "creating $venv"
    if ! python3 -m venv "$venv"; then
        # Debian's python3 lacks ensurepip without python3-venv.
        log "python3 -m venv failed; installing python3-venv"
        rm -rf "$venv"
        if [ "$(id -u)" -eq 0 ]; then
            DEBIAN_FRONTEND=noninteractive apt-get install -y python3-venv ||
                { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y python3-venv; }
        else
            sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y python3-venv
        fi
        python3 -m venv "$venv"
    fi
fi

pip=("$py" -m pip install --quiet --disable-pip-version-check --progress-bar off)
log "installing vllm==$vllm_version ${test_packages[*]} into $venv (vLLM is about 10 GB on first install)"
rm -f "$stamp"
"${pip[@]}" "vllm==$vllm_version" "${test_packages[@]}" >&2
if [ -f "$nodeps_reqs" ]; then
    log "installing $nodeps_reqs (--no-deps)"
    "${pip[@]}" --no-deps -r "$nodeps_reqs" >&2
fi
if [ -f "$reqs" ]; then
    log "installing $reqs"
    "${pip[@]}" -r "$reqs" >&2
fi
wanted_stamp >"$stamp"
if ! complete; then
    log "$venv is still incomplete after installing: vllm $vllm_version does not import"
    exit 1
fi
if ! lmcache_ok; then
    log "$venv is still incomplete after installing: lmcache does not import"
    exit 1
fi
echo "$py"
