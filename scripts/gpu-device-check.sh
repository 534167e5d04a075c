#!/usr/bin/env bash
# What a bare GPU machine can check of the GPU path, installing nothing: a machine with an NVIDIA GPU,
# its python3 with a CUDA torch, nvcc and a C++ compiler, but no package index and no SGLang (which
# is several GB with its CUDA torch and kernels; make gpu-check runs SGLang itself where it is
# installed). In well under 3 minutes it prints:
#   nvidia-smi;
#   the dashboard's GPU preflight (python -m backend.engines.gpu_probe): on such a machine it should
#     name SGLang alone as missing, and this says whether it does;
#   nvcc, the C++ compiler and ninja, with their versions;
#   a CUDA kernel compiled for this GPU's architecture with torch's load_inline, run and checked
#     (python -m scripts.gpu_kernel_check).
# Without an NVIDIA GPU it prints one line saying so and exits 1. The whole output also goes to
# $OUT/gpu-device-check.log where OUT is set (a device runner's folder that comes back).
# Usage: scripts/gpu-device-check.sh [PYTHON]   (default python3)
set -uo pipefail
cd "$(dirname "$0")/.."
python=${1:-python3}
LIMIT_S=170  # the whole check, in seconds: the kernel's build gets what the rest left of it

if ! command -v nvidia-smi >/dev/null 2>&1 && ! compgen -G '/dev/nvidia[0-9]*' >/dev/null; then
    echo "gpu-device-check: no NVIDIA GPU here (no nvidia-smi on PATH, no /dev/nvidia*): nothing to check"
    exit 1
fi

version() {  # $1 = what, rest = a command printing its version: "what: version", or MISSING
    local what=$1 said
    shift
    if said=$(timeout 10 "$@" 2>&1); then
        echo "$what: $(grep -m1 -E '[0-9]+\.[0-9]+' <<<"$said" | sed 's/^ *//')"
    else
        echo "$what: MISSING ($* failed)"
        return 1
    fi
}

checks() {  # every check in turn; returns 1 where one failed
    local started=$SECONDS status=0 preflight said missing nvcc=nvcc left

    echo "=== nvidia-smi"
    timeout 20 nvidia-smi || { echo "nvidia-smi failed (exit $?)"; status=1; }

    echo "=== GPU preflight (python -m backend.engines.gpu_probe)"
    preflight=$(timeout 60 "$python" -m backend.engines.gpu_probe 2>&1)
    said=$?
    echo "$preflight"
    echo "(exit status $said: 0 where SGLang can use this GPU)"
    missing=$(grep '^MISSING' <<<"$preflight" || true)
    if [ -z "$missing" ]; then
        echo "preflight: nothing missing"
    elif ! grep -qv '^MISSING  SGLang' <<<"$missing"; then
        echo "preflight: only SGLang is missing, as expected on a machine without it"
    else
        echo "preflight: missing besides SGLang:"
        grep -v '^MISSING  SGLang' <<<"$missing"
        status=1
    fi

    echo "=== toolchain"
    command -v nvcc >/dev/null 2>&1 || nvcc="${CUDA_HOME:-/usr/local/cuda}/bin/nvcc"
    version nvcc "$nvcc" --version || status=1
    version "C++ compiler" "${CXX:-g++}" --version || status=1
    version ninja ninja --version || version "ninja (python)" "$python" -m ninja --version \
        || echo "  torch's load_inline needs ninja: the kernel check below says so"

    echo "=== a CUDA kernel for this GPU (python -m scripts.gpu_kernel_check)"
    local left=$((LIMIT_S - (SECONDS - started)))  # what is left of the 3 minutes
    timeout "$((left > 30 ? left : 30))" "$python" -m scripts.gpu_kernel_check || status=1

    echo "=== gpu-device-check: $([ "$status" -eq 0 ] && echo passed || echo FAILED) in $((SECONDS - started)) s"
    return "$status"
}

if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    checks 2>&1 | tee "$OUT/gpu-device-check.log"
    exit "${PIPESTATUS[0]}"
fi
checks
