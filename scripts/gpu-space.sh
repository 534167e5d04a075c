#!/usr/bin/env bash
# Lays out a GPU Space (a Docker Space) in DEST: the repo's tracked files, with
# deploy/gpu-space/Dockerfile as the Space's Dockerfile and deploy/gpu-space/README.md (its front
# matter says sdk: docker, app_port) as its README.md. DEST may be a clone of the Space's own git
# repository: commit and push from there (docs/engines.md, "As a GPU Space").
# Usage: scripts/gpu-space.sh DEST
set -euo pipefail
dest=${1:?usage: scripts/gpu-space.sh DEST}
cd "$(dirname "$0")/.."
mkdir -p "$dest"
git ls-files -z | while IFS= read -r -d '' file; do
    [ -f "$file" ] || continue
    mkdir -p "$dest/$(dirname "$file")"
    cp -p "$file" "$dest/$file"
done
cp deploy/gpu-space/Dockerfile "$dest/Dockerfile"
cp deploy/gpu-space/README.md "$dest/README.md"
cp deploy/gpu-space/Dockerfile.dockerignore "$dest/.dockerignore"
echo "GPU Space laid out in $dest: Dockerfile and README.md from deploy/gpu-space/"
