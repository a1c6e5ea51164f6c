#!/usr/bin/env bash
# The read-only real-GPU tier (tests/gpu), in one command on a GPU machine.
#
#   hack/gpu-tier.sh [run] [PYTEST ARGS...]   on the GPU machine, from the repository root: installs
#                                             the carried wheels into a temporary folder, then runs
#                                             pytest -q -s on tests/gpu (with $OUT set, the log is
#                                             also written to $OUT/gpu-tier.log)
#   hack/gpu-tier.sh prepare                  here (make gpu-test): builds what the GPU machine
#                                             lacks into .gpu-carry/ and prints the device call
#
# .gpu-carry/ holds stubdriver/ (the stub driver's artefacts, the CUDA probe among them, built
# with this machine's gcc, and glibc/: the libc and loader the probe was linked with, for the
# CDI-only container's image) and wheels/ (the pure-Python and cp312 manylinux wheels of what
# the tier imports, at the versions of this checkout's .venv). Nothing the tier runs changes the
# GPU: no MIG mode, clocks, persistence mode or reset.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CARRY=${GPU_TIER_CARRY:-.gpu-carry}
# What tests/gpu and the agents it runs import, beside the standard library (pygments: pytest's).
WHEELS=(
  pytest pluggy iniconfig packaging pygments
  pydantic pydantic-core annotated-types typing-inspection typing-extensions
  grpcio protobuf prometheus-client nvidia-ml-py pyyaml jinja2 markupsafe
)
PLATFORMS=(
  manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_24_x86_64 manylinux_2_27_x86_64
  manylinux_2_28_x86_64 manylinux_2_31_x86_64 manylinux_2_34_x86_64 manylinux1_x86_64
)
TIMEOUT_S=420

prepare() {
  local py=${PYTHON:-$REPO/.venv/bin/python}
  cd "$REPO"
  if [ "$(uname -m)" != x86_64 ]; then
    echo "prepare: this machine is $(uname -m); the GPU machine is x86_64: build there" >&2
    exit 1
  fi
  rm -rf "$CARRY/stubdriver" "$CARRY/wheels"
  mkdir -p "$CARRY/stubdriver" "$CARRY/wheels"
  echo "== stub artefacts and the glibc the CUDA probe links ($CARRY/stubdriver)"
  PYTHONPATH="$REPO/src:$REPO" "$py" - "$CARRY/stubdriver" <<'PY'
import shutil
import sys
import tempfile
from pathlib import Path

from gpu_operator.sim.stubdriver import PROBE, build_stubs
from tests.gpu.container import collect_glibc
from tests.gpu.host import GLIBC_DIR

dest = Path(sys.argv[1])
with tempfile.TemporaryDirectory() as tmp:
    built = build_stubs(Path(tmp))
    for artefact in sorted(built.iterdir()):
        shutil.copy2(artefact, dest / artefact.name)
collect_glibc(dest / PROBE, dest / GLIBC_DIR)
for path in sorted(dest.rglob("*")):
    if path.is_file():
        print(f"  {path.relative_to(dest)} ({path.stat().st_size} B)")
PY
  echo "== wheels for Python 3.12 x86_64 ($CARRY/wheels), at this checkout's .venv versions"
  local specs=() name version platform_args=()
  for name in "${WHEELS[@]}"; do
    version=$("$py" -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' "$name")
    specs+=("$name==$version")
  done
  for platform in "${PLATFORMS[@]}"; do platform_args+=(--platform "$platform"); done
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${platform_args[@]}" -d "$CARRY/wheels" "${specs[@]}"
  ls -1 "$CARRY/wheels" | sed 's/^/  /'
  echo "== $CARRY: $(du -sh "$CARRY" | cut -f1) (the device call carries at most 64 MiB)"
  cat <<EOF

Run the tier on the GPU machine with the device tool (one call; the machine runs as root):
  run(command="hack/gpu-tier.sh", carry=["$CARRY"], timeout_s=$TIMEOUT_S)
then give_back unless you rerun at once. The log comes back as \$OUT/gpu-tier.log.
EOF
}

run_tier() {
  local py=${PYTHON:-python3}
  cd "$REPO"
  local site
  site=$(mktemp -d /tmp/gpu-tier-site.XXXXXX)
  # shellcheck disable=SC2064 # expanded now: $site is local
  trap "rm -rf '$site'" EXIT
  if compgen -G "$CARRY/wheels/*.whl" >/dev/null; then
    PIP_ROOT_USER_ACTION=ignore "$py" -m pip install -q --no-index --find-links "$CARRY/wheels" \
      --no-deps --no-compile --no-cache-dir --disable-pip-version-check --target "$site" \
      "$CARRY"/wheels/*.whl
  else
    echo "gpu tier: no $CARRY/wheels (make gpu-test prepares them); using this Python's packages"
  fi
  export PYTHONPATH="$REPO/src:$REPO:$site${PYTHONPATH:+:$PYTHONPATH}"
  if [ -f "$CARRY/stubdriver/gpu-operator-cuda-probe" ]; then
    export GPU_OPERATOR_STUB_ARTEFACTS="$REPO/$CARRY/stubdriver"
  fi
  # Only pytest's own plugins: the machine's (other versions) must not meet the carried pytest.
  export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
  local log=/dev/null
  if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then log="$OUT/gpu-tier.log"; fi
  {
    echo "== gpu tier on $(hostname) ($(uname -r), uid $(id -u)), $("$py" --version 2>&1)"
    if command -v nvidia-smi >/dev/null; then
      nvidia-smi --query-gpu=index,name,driver_version,memory.total,mig.mode.current \
        --format=csv,noheader || true
    else
      echo "nvidia-smi: not on PATH"
    fi
    echo "probe: ${GPU_OPERATOR_STUB_ARTEFACTS:-built here with gcc (no carried artefacts)}"
  } 2>&1 | tee "$log"
  set +e
  "$py" -m pytest -q -s -rfEs -p no:randomly -p no:cacheprovider \
    -W ignore::pytest.PytestConfigWarning tests/gpu "$@" 2>&1 | tee -a "$log"
  local rc=${PIPESTATUS[0]}
  set -e
  echo "== gpu tier: pytest exited $rc ($([ "$rc" = 0 ] && echo 'every check passed or skipped' \
    || echo 'see the failures above'))" | tee -a "$log"
  return "$rc"
}

case "${1:-run}" in
  prepare) prepare ;;
  run) shift $(($# > 0 ? 1 : 0)); run_tier "$@" ;;
  -h | --help) sed -n '2,15p' "$0" ;;
  *) run_tier "$@" ;;
esac
