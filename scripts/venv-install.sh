#!/usr/bin/env bash
# Installs packages into a virtual environment with uv (pinned, installed into that environment by
# pip first), from the package sources pip is configured with on this machine (find-links, index
# URLs: uv reads no pip configuration). The Makefile's environment and the engine environments
# (scripts/prepare-engine-envs.sh) are installed this way.
#
# uv rather than pip: the same pins resolve to the same versions, unpacked in a fraction of pip's
# CPU time (vLLM's environment in 1 min 4 s against pip's 3 min 6 s, SGLang's in 1 min 45 s against
# 4 min 5 s, on 2 cores). Bytecode is compiled as pip compiles it, so imports cost what they did.
# `unsafe-best-match` weighs every source's versions together, as pip does (uv's default takes a
# package from the first source that has it, which would miss a local CPU build of torch).
#
# Usage: scripts/venv-install.sh VENV [uv pip install arguments...]   (the venv is created if missing)
#        scripts/venv-install.sh --uninstall VENV PACKAGE...          (packages not installed are skipped)
set -euo pipefail
UV="uv==0.13.9"
PYTHON="${PYTHON:-python3}"

uninstall=0
if [ "${1:-}" = "--uninstall" ]; then uninstall=1; shift; fi
venv="${1:?usage: scripts/venv-install.sh [--uninstall] VENV ARGS...}"
shift

[ -x "$venv/bin/python" ] || "$PYTHON" -m venv "$venv"
[ -x "$venv/bin/uv" ] || "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$UV"

if [ "$uninstall" = 1 ]; then
  "$venv/bin/uv" pip uninstall --quiet --python "$venv/bin/python" "$@" >/dev/null 2>&1 || true
  exit 0
fi

sources=()
while IFS='=' read -r key value; do
  value="${value#\'}" value="${value%\'}"
  case "$key" in
    *.find-links) for item in $value; do sources+=(--find-links "$item"); done ;;
    *.extra-index-url) for item in $value; do sources+=(--extra-index-url "$item"); done ;;
    *.index-url) sources+=(--index-url "$value") ;;
  esac
done < <("$venv/bin/python" -m pip config list 2>/dev/null)

exec "$venv/bin/uv" pip install --quiet --python "$venv/bin/python" --compile-bytecode \
  --index-strategy unsafe-best-match "${sources[@]}" "$@"
