#!/usr/bin/env bash
# Checks, with pip's resolver in dry-run against the real package metadata on PyPI, that the GPU
# install (requirements-gpu.txt, also a GPU Space's requirements.txt) resolves and keeps SGLang's own
# pins: torch, transformers and tokenizers at the versions SGLang asks for, and the dashboard's pins.
# Downloads metadata only (a minute or two); needs PyPI. Usage: scripts/check-gpu-install.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
REPORT="$(mktemp)"
trap 'rm -f "$REPORT"' EXIT
# --isolated: PyPI as a GPU machine sees it, without this machine's pip settings or local wheels.
"$PYTHON" -m pip install --isolated --quiet --disable-pip-version-check --dry-run --ignore-installed \
  --report "$REPORT" -r requirements-gpu.txt
"$PYTHON" - "$REPORT" <<'PY'
import json, re, sys

install = json.load(open(sys.argv[1]))["install"]
resolved = {i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"] for i in install}
sglang = next(i["metadata"] for i in install if i["metadata"]["name"].lower() == "sglang")
# SGLang's own exact pins of the packages its kernels are built against, read from its metadata.
sglang_pins = {}
for requirement in sglang.get("requires_dist", []):
    match = re.match(r"^(torch|transformers|tokenizers)\s*==\s*([\w.]+)\s*(;.*)?$", requirement)
    if match and not (match.group(3) or "").strip("; ").startswith("extra"):
        sglang_pins[match.group(1)] = match.group(2)
if set(sglang_pins) != {"torch", "transformers", "tokenizers"}:
    sys.exit(f"SGLang's metadata no longer pins torch, transformers and tokenizers exactly: {sglang_pins}")
ours = {}
for line in open("requirements-gpu.txt"):
    line = line.split("#")[0].strip()
    if "==" in line:
        name, version = line.split("==")
        ours[name.lower()] = version
wrong = {name: (resolved.get(name), want) for name, want in {**sglang_pins, **ours}.items()
         if resolved.get(name) != want}
if wrong:
    sys.exit(f"the GPU install does not resolve as it should (got, wanted): {wrong}")
print("GPU install resolves with SGLang's pins intact:",
      ", ".join(f"{n} {resolved[n]}" for n in ("sglang", "torch", "transformers", "tokenizers", "numpy")),
      f"({len(resolved)} packages)")
PY
