#!/usr/bin/env bash
# Builds etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok and helm from their
# Go modules into a versioned cache directory outside the repository. Idempotent: a binary that is
# already cached is not rebuilt. Prints the bin directory on its last line.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.34.4}
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}
KWOK_VERSION=${KWOK_VERSION:-v0.7.0}
HELM_VERSION=${HELM_VERSION:-v3.22.0}
CACHE_ROOT=${TESTENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-operator-testenv}
KEY="k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}"
BIN="$CACHE_ROOT/$KEY/bin"
WORK="$CACHE_ROOT/$KEY/src"
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0

mkdir -p "$BIN" "$WORK"
command -v go >/dev/null || { echo "testenv: Go toolchain not found on PATH" >&2; exit 3; }

log() { echo "testenv: $*" >&2; }

build_k8s() {
  local mod="$WORK/kubernetes"
  mkdir -p "$mod"
  if [ ! -f "$mod/go.mod" ]; then
    log "preparing k8s.io/kubernetes $K8S_VERSION module"
    local upstream minor
    upstream=$(curl -fsSL "$(go env GOPROXY | cut -d, -f1)/k8s.io/kubernetes/@v/${K8S_VERSION}.mod")
    minor="v0.${K8S_VERSION#v1.}"
    {
      echo "module testenv/kubernetes"
      echo
      echo "go $(echo "$upstream" | awk '/^go /{print $2; exit}')"
      echo
      echo "require k8s.io/kubernetes $K8S_VERSION"
      echo
      echo "$upstream" | awk '/=> \.\/staging\//{print $1}' | sort -u | while read -r m; do
        echo "replace $m => $m $minor"
      done
    } >"$mod/go.mod.tmp"
    mv "$mod/go.mod.tmp" "$mod/go.mod"
    cat >"$mod/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
)
GO
    (cd "$mod" && go mod tidy -e >/dev/null 2>&1 || true)
  fi
  for cmd in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy; do
    if [ ! -x "$BIN/$cmd" ]; then
      log "building $cmd $K8S_VERSION (first build takes many minutes)"
      (cd "$mod" && go build -trimpath -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2)" -o "$BIN/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd")
      mv "$BIN/$cmd.tmp" "$BIN/$cmd"
    fi
  done
}

build_etcd() {
  [ -x "$BIN/etcd" ] && return
  log "building etcd $ETCD_VERSION"
  local mod="$WORK/etcd"
  mkdir -p "$mod"
  if [ ! -f "$mod/go.mod" ]; then
    printf 'module testenv/etcd\n\ngo 1.24\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ETCD_VERSION" >"$mod/go.mod"
    printf '//go:build tools\n\npackage tools\n\nimport _ "go.etcd.io/etcd/server/v3/etcdmain"\n' >"$mod/tools.go"
    cat >"$mod/main.go" <<'GO'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
    (cd "$mod" && go mod tidy >/dev/null)
  fi
  (cd "$mod" && go build -trimpath -ldflags "-s -w" -o "$BIN/etcd.tmp" .)
  mv "$BIN/etcd.tmp" "$BIN/etcd"
}

build_kwok() {
  [ -x "$BIN/kwok" ] && return
  log "building kwok $KWOK_VERSION"
  GOBIN="$BIN" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
}

# helm is not part of the cache key (a new helm must not rebuild the control plane): a cached
# binary of another version is rebuilt. Its default Kubernetes version (`helm template`, `lint`
# and a chart's kubeVersion check) is set from the client-go it is built with, as helm's own
# release build does.
build_helm() {
  if [ -x "$BIN/helm" ] && [ "$("$BIN/helm" version --template '{{.Version}}' 2>/dev/null)" = "$HELM_VERSION" ]; then
    return
  fi
  local start=$SECONDS gomod kube minor
  log "building helm $HELM_VERSION"
  gomod=$(go mod download -json "helm.sh/helm/v3@$HELM_VERSION" | awk -F'"' '/"GoMod"/{print $4}')
  kube=$(awk '$1 == "k8s.io/client-go" {print $2}' "$gomod")
  minor=$(echo "$kube" | cut -d. -f2)
  GOBIN="$BIN" go install -trimpath -ldflags "-s -w \
    -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION \
    -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$minor \
    -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$minor" \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  log "built helm $HELM_VERSION (Kubernetes 1.$minor defaults) in $((SECONDS - start))s"
}

case "${1:-all}" in
  all) build_etcd; build_kwok; build_helm; build_k8s ;;
  etcd) build_etcd ;;
  kwok) build_kwok ;;
  helm) build_helm ;;
  kubernetes) build_k8s ;;
  *) echo "usage: $0 [all|etcd|kwok|helm|kubernetes]" >&2; exit 2 ;;
esac
echo "$BIN"
