#!/usr/bin/env bash
# The real-engine tests (tests/test_engines_real.py), their groups at once: a pytest per group, each
# starting the servers its tests share (tests/conftest.py, ENGINE_GROUPS). Most of the tests' time
# is servers starting, one at a time in a group; two cores serve three groups' starts side by side.
# Prints each group's output in turn; fails when any group fails.
# Usage: scripts/test-engines.sh PYTHON [pytest args...]
set -uo pipefail
cd "$(dirname "$0")/.."
python=$1
shift
runs=("server_sglang" "server_vllm or app_failing" "app_serving")
logs=$(mktemp -d)
pids=()
for i in "${!runs[@]}"; do
    DASHBOARD_REAL_ENGINES=1 "$python" -m pytest --timeout 900 tests/test_engines_real.py \
        -m "${runs[$i]}" -p no:cacheprovider "$@" >"$logs/$i.log" 2>&1 &
    pids+=($!)
done
status=0
for i in "${!runs[@]}"; do
    if wait "${pids[$i]}"; then result=passed; else result=FAILED; status=1; fi
    echo "=== engine tests: -m \"${runs[$i]}\": $result"
    cat "$logs/$i.log"
done
rm -rf "$logs"
exit $status
