#!/usr/bin/env bash
# The real-engine tests (tests/test_engines_real.py), their groups at once: a pytest per group, each
# starting the servers its tests share (tests/conftest.py, ENGINE_GROUPS). Most of the tests' time
# is servers starting, one at a time in a group; two cores serve the groups' starts side by side.
#
# Without ENGINE_PREPARE_PID it first prepares every engine environment (scripts/prepare-engine-envs.sh).
# With ENGINE_PREPARE_PID set to the process preparing them (.ci/run starts it beside everything
# else), each group starts as soon as the parts it needs are ready, so the SGLang groups need not
# wait for vLLM's environment nor vLLM's for SGLang's; a group whose parts that process ended without
# fails.
# Prints each group's output in turn; fails when any group fails.
# Usage: scripts/test-engines.sh PYTHON [pytest args...]
set -uo pipefail
cd "$(dirname "$0")/.."
python=$1
shift
groups=("server_sglang" "app_serving" "app_failing" "server_vllm")
needs=("sglang sglang-app router model" "sglang sglang-app model" "sglang sglang-app model" "vllm model")
# Every SGLang group waits for all the parts in the SGLang environment: pip must not change packages
# under a running server.

if [ -z "${ENGINE_PREPARE_PID:-}" ]; then
    scripts/prepare-engine-envs.sh || exit 1
fi

wait_for_parts() {  # $1 = parts: returns once they are ready; fails if the preparing process ended first
    local waited=0
    until scripts/prepare-engine-envs.sh --check $1; do
        if ! kill -0 "$ENGINE_PREPARE_PID" 2>/dev/null && ! scripts/prepare-engine-envs.sh --check $1; then
            echo "the engine environments' preparation ended without all of: $1 (see its log)"
            return 1
        fi
        sleep 5
        waited=$((waited + 5))
    done
    [ "$waited" -eq 0 ] || echo "waited ${waited} s for: $1"
}

logs=$(mktemp -d)
pids=()
for i in "${!groups[@]}"; do
    (
        if [ -n "${ENGINE_PREPARE_PID:-}" ]; then wait_for_parts "${needs[$i]}" || exit 1; fi
        started=$SECONDS
        DASHBOARD_REAL_ENGINES=1 "$python" -m pytest --timeout 900 tests/test_engines_real.py \
            -m "${groups[$i]}" -p no:cacheprovider "$@"
        status=$?
        echo "(${groups[$i]}: $((SECONDS - started)) s)"
        exit $status
    ) >"$logs/$i.log" 2>&1 &
    pids+=($!)
done
status=0
for i in "${!groups[@]}"; do
    if wait "${pids[$i]}"; then result=passed; else result=FAILED; status=1; fi
    echo "=== engine tests: -m \"${groups[$i]}\": $result"
    cat "$logs/$i.log"
done
rm -rf "$logs"
exit $status
