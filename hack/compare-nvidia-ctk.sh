#!/usr/bin/env bash
# Our CDI spec against NVIDIA's `nvidia-ctk cdi generate` (nvml mode) for the same driver root:
# the stub driver laid out in each style, both tools run on it, the differences printed.
# Needs Go (the module proxy) once, to build nvidia-ctk; not part of `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."
CTK_VERSION=${CTK_VERSION:-v1.18.0}
BIN=${TESTENV_CACHE:-$HOME/.cache/gpu-operator-testenv}/nvidia-ctk-$CTK_VERSION
if [ ! -x "$BIN/nvidia-ctk" ]; then
  echo "building nvidia-ctk $CTK_VERSION (once) ..."
  GOBIN=$BIN go install "github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-ctk@$CTK_VERSION"
fi
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
for style in ubuntu rhel gke; do
  root=$work/$style
  .venv/bin/gpu-operator agent simulate-driver install --root "$root" --spec h100-80gb:2 \
    --style "$style" --driver-version 580.95.05 --seed compare >/dev/null
  "$BIN/nvidia-ctk" --quiet cdi generate --driver-root "$root" --format json --output "$work/ctk-$style.json"
  .venv/bin/gpu-operator agent cdi generate --driver-root "$root" -o json > "$work/ours-$style.json"
  .venv/bin/python hack/compare_cdi_specs.py "$style" "$root" "$work/ctk-$style.json" "$work/ours-$style.json"
done
