#!/usr/bin/env bash
# Builds the environment the vLLM disk bench measures NVIDIA's KVCR in (vLLM
# 0.33's built-in `kvcr` tier) and prints its interpreter's path on stdout.
# Not used by CI: KVCR is a bench peer, not a dependency.
#
#   scripts/kvcr_env.sh    # reuse it when kvcr imports, else build it
#
# It is a copy of the engines' venv (scripts/engine_env.sh), so the engines'
# own venv stays as CI expects it, plus kvcr==0.1.1, nixl==1.5.0 and the
# nixl-cu13 wheel nixl's meta package loads (it picks the CUDA 13 build that
# torch names), all --no-deps: their other requirements (msgspec, pyzmq, torch)
# are vLLM's and already there, and a resolver run would replace torch.
#   KVTIER_KVCR_VENV (default ${XDG_CACHE_HOME:-$HOME/.cache}/kvtier/kvcr-venv)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${KVTIER_KVCR_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kvtier/kvcr-venv}"
packages=(kvcr==0.1.1 nixl==1.5.0 nixl-cu13==1.5.0)
py="$venv/bin/python"

log() { echo "kvcr_env.sh: $*" >&2; }

imports_kvcr() {
    "$py" -c 'import kvcr, vllm.v1.kv_offload.tiering.kvcr.manager' >/dev/null 2>&1
}

if [ -x "$py" ] && imports_kvcr; then
    echo "$py"
    exit 0
fi

engines_py="$(bash "$repo/scripts/engine_env.sh")"
engines="$(dirname "$(dirname "$engines_py")")"
if [ ! -x "$py" ]; then
    log "copying $engines to $venv (about 10 GB)"
    cp -a "$engines" "$venv"
    # The copy's console scripts still name the original's interpreter.
    grep -rlI "^#!$engines/bin/python" "$venv/bin" | xargs -r sed -i "1s|^#!$engines/|#!$venv/|"
fi
before="$("$py" -m pip freeze | grep -Ei '^(torch|vllm)==')"
"$py" -m pip install --no-deps "${packages[@]}" >&2
after="$("$py" -m pip freeze | grep -Ei '^(torch|vllm)==')"
if [ "$before" != "$after" ]; then
    log "torch or vllm changed: $before -> $after"
    exit 1
fi
imports_kvcr || { log "kvcr still does not import in $venv"; exit 1; }
echo "$py"
