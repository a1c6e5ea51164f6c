#!/usr/bin/env bash
# Regenerates src/gpu_operator/kubelet_api/ from the kubelet's published gRPC APIs
# (k8s.io/kubelet, fetched through the Go module proxy) with grpcio-tools' protoc.
#
#   hack/gen-kubelet-protos.sh            regenerate in place
#   hack/gen-kubelet-protos.sh OUT_DIR    generate into OUT_DIR (the drift test compares)
#
# Two mechanical edits, both only for Python: the gogoproto import and options are dropped
# (they steer Go code generation and have no meaning on the wire), and the generated stubs
# import their messages relatively, so the package can live inside gpu_operator.
set -euo pipefail

KUBELET_VERSION=${KUBELET_VERSION:-v0.34.4}
GRPCIO_TOOLS_VERSION=${GRPCIO_TOOLS_VERSION:-1.85.1}
APIS=(deviceplugin/v1beta1 podresources/v1 pluginregistration/v1 dra/v1 dra/v1beta1)

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${1:-$ROOT/src/gpu_operator/kubelet_api}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

command -v go >/dev/null || { echo "gen-kubelet-protos: Go is needed to fetch k8s.io/kubelet" >&2; exit 3; }
MOD=$(cd "$WORK" && GOFLAGS=-mod=mod GOTOOLCHAIN=local go mod download -json "k8s.io/kubelet@$KUBELET_VERSION" \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')

TOOLS="$WORK/tools"
python3 -m venv "$TOOLS"
"$TOOLS/bin/pip" install -q "grpcio-tools==$GRPCIO_TOOLS_VERSION"

mkdir -p "$WORK/proto"
for api in "${APIS[@]}"; do
  mkdir -p "$WORK/proto/$api"
  sed -e '/import "github.com\/gogo\/protobuf\/gogoproto\/gogo.proto";/d' \
      -e '/^option (gogoproto\./d' \
      -e 's/ \[(gogoproto\.[a-z_]*) = "[A-Za-z]*"\]//' \
      "$MOD/pkg/apis/$api/api.proto" >"$WORK/proto/$api/api.proto"
done

GEN="$WORK/gen"
mkdir -p "$GEN"
(cd "$WORK/proto" && "$TOOLS/bin/python" -m grpc_tools.protoc -I. --python_out="$GEN" \
  --pyi_out="$GEN" --grpc_python_out="$GEN" "${APIS[@]/%//api.proto}")

for api in "${APIS[@]}"; do
  mod=${api//\//.}
  sed -i -e "s/^from ${mod} import api_pb2 as/from . import api_pb2 as/" "$GEN/$api/api_pb2_grpc.py"
done

mkdir -p "$OUT"
for api in "${APIS[@]}"; do
  mkdir -p "$OUT/$api"
  cp "$GEN/$api/api_pb2.py" "$GEN/$api/api_pb2.pyi" "$GEN/$api/api_pb2_grpc.py" "$OUT/$api/"
  touch "$OUT/$api/__init__.py" "$OUT/${api%/*}/__init__.py"
done
echo "gen-kubelet-protos: k8s.io/kubelet $KUBELET_VERSION -> $OUT" >&2
