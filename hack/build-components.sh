#!/usr/bin/env bash
# Builds the testenv's components from their Go modules into versioned cache directories outside
# the repository. Idempotent: a binary or image that is already cached is not rebuilt. Every step
# logs what it builds and how long it took (and a line a minute while a long one runs).
#
#   all | kubernetes | etcd | kwok   etcd, kube-apiserver, kcm, kube-scheduler, kwok, kubelet and
#                                    kube-proxy (all: and helm); prints their bin directory on its
#                                    last line
#   helm                             helm, for the Helm chart's tests, into the same bin directory
#   toxiproxy                        toxiproxy-server, the chaos suite's TCP fault proxy, into the
#                                    same bin directory (all builds it too)
#   nodes                            what real nodes add: containerd, containerd-shim-runc-v2, ctr
#                                    (containerd v2, CDI built in), a static pause and the two
#                                    images (pause, a busybox shell) as OCI archives made with
#                                    buildah; prints the node directory on its last line
#   image                            the project's image from its Dockerfile with buildah, offline
#                                    but for PyPI: each FROM image is a stand-in made locally
#                                    (Debian bookworm + python3 from the Debian archive, with
#                                    mmdebstrap) and tagged with the FROM name; prints the OCI
#                                    archive's path on its last line
#   standins                         the stand-ins for NVIDIA's operand images, FROM the project's
#                                    image (SIMULATED operands); prints their archive's path
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.37.2}
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}
KWOK_VERSION=${KWOK_VERSION:-v0.7.0}
HELM_VERSION=${HELM_VERSION:-v3.22.0}
CONTAINERD_VERSION=${CONTAINERD_VERSION:-v2.4.2}
TOXIPROXY_VERSION=${TOXIPROXY_VERSION:-v2.12.0}
# Bump when the pause/probe programs or the image recipes below change.
NODE_IMAGES_VERSION=${NODE_IMAGES_VERSION:-1}
CACHE_ROOT=${TESTENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-operator-testenv}
KEY="k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}"
BIN="$CACHE_ROOT/$KEY/bin"
WORK="$CACHE_ROOT/$KEY/src"
NODE_KEY="containerd-${CONTAINERD_VERSION}_images-${NODE_IMAGES_VERSION}"
NODE_DIR="$CACHE_ROOT/$NODE_KEY"
NODE_BIN="$NODE_DIR/bin"
NODE_IMAGES="$NODE_DIR/images"
NODE_WORK="$NODE_DIR/src"
# The project's image and the stand-ins: buildah's store and the archives (not versioned by key:
# a rebuild reuses buildah's layer cache, and a changed tree makes a new image).
IMAGE_DIR="$CACHE_ROOT/images"
# Bump when the base stand-in's recipe (build_base_standin) changes.
BASE_RECIPE_VERSION=${BASE_RECIPE_VERSION:-1}
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0

case "${1:-all}" in
  image | standins) ;;
  *) command -v go >/dev/null || { echo "testenv: Go toolchain not found on PATH" >&2; exit 3; } ;;
esac

log() { echo "testenv: $*" >&2; }

# step WHAT COMMAND...: run one build step, logging its start, a line a minute while it runs and
# its elapsed time at the end (a cold build of the Kubernetes binaries takes many minutes).
step() {
  local what=$1 t0=$SECONDS next=60 pid rc
  shift
  log "$what ..."
  "$@" &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    if ((SECONDS - t0 >= next)); then
      log "  $what: still running after $((SECONDS - t0))s"
      next=$((next + 60))
    fi
  done
  if wait "$pid"; then
    log "$what: done in $((SECONDS - t0))s"
  else
    rc=$?
    log "$what: FAILED after $((SECONDS - t0))s (exit $rc)"
    return "$rc"
  fi
}

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
    step "resolving k8s.io/kubernetes $K8S_VERSION dependencies" \
      bash -c 'cd "$1" && { go mod tidy -e >/dev/null 2>&1 || true; }' _ "$mod"
  fi
  local cmds=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy) i=0
  for cmd in "${cmds[@]}"; do
    i=$((i + 1))
    if [ ! -x "$BIN/$cmd" ]; then
      step "building $cmd $K8S_VERSION [$i/${#cmds[@]}] (the first one compiles the shared packages: many minutes)" \
        go_build_k8s "$mod" "$cmd"
      mv "$BIN/$cmd.tmp" "$BIN/$cmd"
    fi
  done
}

go_build_k8s() {
  local mod=$1 cmd=$2
  cd "$mod" && go build -trimpath -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2)" -o "$BIN/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd"
}

build_etcd() {
  [ -x "$BIN/etcd" ] && return
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
  fi
  step "building etcd $ETCD_VERSION" \
    bash -c 'cd "$1" && go mod tidy >/dev/null && go build -trimpath -ldflags "-s -w" -o "$2.tmp" .' \
    _ "$mod" "$BIN/etcd"
  mv "$BIN/etcd.tmp" "$BIN/etcd"
}

build_kwok() {
  [ -x "$BIN/kwok" ] && return
  step "building kwok $KWOK_VERSION" \
    env GOBIN="$BIN" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
}

# helm is not part of the cache key (a new helm must not rebuild the control plane): a cached
# binary of another version is rebuilt. Its default Kubernetes version (`helm template`, `lint`
# and a chart's kubeVersion check) is set from the client-go it is built with, as helm's own
# release build does.
build_helm() {
  if [ -x "$BIN/helm" ] && [ "$("$BIN/helm" version --template '{{.Version}}' 2>/dev/null)" = "$HELM_VERSION" ]; then
    return
  fi
  local gomod minor
  gomod=$(go mod download -json "helm.sh/helm/v3@$HELM_VERSION" | awk -F'"' '/"GoMod"/{print $4}')
  minor=$(awk '$1 == "k8s.io/client-go" {print $2}' "$gomod" | cut -d. -f2)
  step "building helm $HELM_VERSION (Kubernetes 1.$minor defaults)" \
    env GOBIN="$BIN" go install -trimpath -ldflags "-s -w \
    -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION \
    -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$minor \
    -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$minor" \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
}

# toxiproxy is not part of the cache key either; a cached binary of another version is rebuilt.
build_toxiproxy() {
  if [ -x "$BIN/toxiproxy-server" ] && [ "$(cat "$BIN/toxiproxy-server.version" 2>/dev/null)" = "$TOXIPROXY_VERSION" ]; then
    return
  fi
  step "building toxiproxy-server $TOXIPROXY_VERSION" \
    env GOBIN="$BIN" go install -trimpath -ldflags "-s -w" \
    "github.com/Shopify/toxiproxy/v2/cmd/server@$TOXIPROXY_VERSION"
  mv "$BIN/server" "$BIN/toxiproxy-server"
  echo "$TOXIPROXY_VERSION" >"$BIN/toxiproxy-server.version"
}

# containerd v2 (its CRI plugin reads CDI specs from /etc/cdi and /var/run/cdi), the runc shim
# and ctr. Static (CGO_ENABLED=0) without the storage drivers that need cgo headers.
build_containerd() {
  local c have=1
  for c in containerd containerd-shim-runc-v2 ctr; do [ -x "$NODE_BIN/$c" ] || have=0; done
  [ "$have" = 1 ] && return
  local pkg=github.com/containerd/containerd/v2
  step "building containerd, containerd-shim-runc-v2 and ctr $CONTAINERD_VERSION" \
    env GOBIN="$NODE_BIN" go install -trimpath -tags "no_btrfs no_devmapper no_zfs" \
    -ldflags "-s -w -X $pkg/version.Version=$CONTAINERD_VERSION -X $pkg/version.Revision=testenv" \
    "$pkg/cmd/containerd@$CONTAINERD_VERSION" \
    "$pkg/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION" \
    "$pkg/cmd/ctr@$CONTAINERD_VERSION"
}

# Two small static programs for the node images: `pause` (a pod sandbox's init: waits for a
# signal, reaps orphans) and `incluster-get` (GETs an API path the way in-cluster clients do:
# the kubernetes Service's env, the ServiceAccount token, TLS verified with its ca.crt).
build_node_tools() {
  [ -x "$NODE_BIN/pause" ] && [ -x "$NODE_BIN/incluster-get" ] && return
  local mod="$NODE_WORK/tools"
  mkdir -p "$mod/pause" "$mod/incluster-get"
  printf 'module testenv/nodetools\n\ngo 1.22\n' >"$mod/go.mod"
  cat >"$mod/pause/main.go" <<'GO'
// Command pause holds a pod sandbox's namespaces open until it is told to stop.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for { // reap every exited child (it is PID 1 when the pod shares its PID namespace)
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
GO
  cat >"$mod/incluster-get/main.go" <<'GO'
// Command incluster-get prints the response to a GET of an API path, authenticated and verified
// exactly as in-cluster clients are: the kubernetes Service's address from the environment, the
// pod's ServiceAccount token, and the cluster CA mounted beside it.
package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
)

const sa = "/var/run/secrets/kubernetes.io/serviceaccount/"

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: incluster-get /api/path")
		os.Exit(2)
	}
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	token, err := os.ReadFile(sa + "token")
	check(err)
	caPEM, err := os.ReadFile(sa + "ca.crt")
	check(err)
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		check(fmt.Errorf("no certificate in %sca.crt", sa))
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	req, err := http.NewRequest("GET", "https://"+net.JoinHostPort(host, port)+os.Args[1], nil)
	check(err)
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	resp, err := client.Do(req)
	check(err)
	defer resp.Body.Close()
	_, err = io.Copy(os.Stdout, resp.Body)
	check(err)
	if resp.StatusCode != http.StatusOK {
		check(fmt.Errorf("HTTP %s", resp.Status))
	}
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "incluster-get:", err)
		os.Exit(1)
	}
}
GO
  step "building pause and incluster-get" \
    bash -c 'cd "$1" && go build -trimpath -ldflags "-s -w" -o "$2/" ./pause ./incluster-get' \
    _ "$mod" "$NODE_BIN"
}

# OCI image archives made with buildah (FROM scratch, vfs storage private to the cache, nothing
# pulled): the sandbox image and a busybox shell image for test pods. Their names live in
# src/gpu_operator/testenv/binaries.py (NODE_IMAGES).
build_node_images() {
  [ -f "$NODE_IMAGES/pause.oci.tar" ] && [ -f "$NODE_IMAGES/shell.oci.tar" ] && return
  command -v buildah >/dev/null || {
    log "buildah not found: install Debian's buildah (make packages) to build the node images"
    return 3
  }
  local busybox
  busybox=$(command -v busybox) || { log "busybox not found: install Debian's busybox-static (make packages)"; return 3; }
  file -L "$busybox" 2>/dev/null | grep -q 'statically linked' ||
    ldd "$busybox" 2>&1 | grep -q 'not a dynamic executable' ||
    { log "$busybox is not static: install Debian's busybox-static (make packages)"; return 3; }
  step "building images pause and shell with buildah" build_images_with_buildah "$busybox"
}

build_images_with_buildah() {
  local busybox=$1 store="$NODE_WORK/buildah" rootfs="$NODE_WORK/shell-rootfs" ctr applet
  local b=(buildah --root "$store/root" --runroot "$store/run" --storage-driver vfs)
  mkdir -p "$NODE_IMAGES"
  rm -rf "$rootfs" && mkdir -p "$rootfs/bin" "$rootfs/tmp" "$rootfs/etc"
  cp "$busybox" "$rootfs/bin/busybox"
  for applet in $("$busybox" --list); do
    [ "$applet" = busybox ] || ln -sf busybox "$rootfs/bin/$applet"
  done
  cp "$NODE_BIN/incluster-get" "$rootfs/bin/incluster-get"
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$rootfs/etc/passwd"
  printf 'root:x:0:\nnobody:x:65534:\n' >"$rootfs/etc/group"
  chmod 1777 "$rootfs/tmp"

  ctr=$("${b[@]}" from --quiet scratch)
  "${b[@]}" copy --quiet "$ctr" "$NODE_BIN/pause" /pause >/dev/null
  "${b[@]}" config --entrypoint '["/pause"]' --user 65535:65535 \
    --label org.opencontainers.image.title="testenv pause (built locally)" "$ctr"
  "${b[@]}" commit --quiet --rm "$ctr" "oci-archive:$NODE_IMAGES/pause.oci.tar.tmp:localhost/testenv/pause:$NODE_IMAGES_VERSION" >/dev/null
  mv "$NODE_IMAGES/pause.oci.tar.tmp" "$NODE_IMAGES/pause.oci.tar"

  ctr=$("${b[@]}" from --quiet scratch)
  "${b[@]}" copy --quiet "$ctr" "$rootfs" / >/dev/null
  "${b[@]}" config --cmd '["/bin/sh"]' --env PATH=/bin \
    --label org.opencontainers.image.title="testenv shell: Debian busybox-static (built locally)" "$ctr"
  "${b[@]}" commit --quiet --rm "$ctr" "oci-archive:$NODE_IMAGES/shell.oci.tar.tmp:localhost/testenv/shell:$NODE_IMAGES_VERSION" >/dev/null
  mv "$NODE_IMAGES/shell.oci.tar.tmp" "$NODE_IMAGES/shell.oci.tar"
  rm -rf "$rootfs" "$store"
}

# -- the project's image ------------------------------------------------------------------------
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
buildah_cmd() {
  buildah --root "$IMAGE_DIR/store" --runroot "$IMAGE_DIR/run" --storage-driver "${BUILDAH_DRIVER:-overlay}" "$@"
}

# The FROM images of the Dockerfile (not its stage names, not scratch).
from_images() {
  awk 'toupper($1) == "FROM" {
         img = ""; for (i = 2; i <= NF; i++) if ($i !~ /^--/) { img = $i; break }
         if (toupper($(i + 1)) == "AS") stage[tolower($(i + 2))] = 1
         if (img != "scratch" && !(tolower(img) in stage)) print img
       }' "$REPO_ROOT/Dockerfile" | sort -u
}

# A local stand-in for a python:3.11-slim-bookworm image: Debian bookworm (minbase, merged /usr)
# with Debian's python3 and pip from the Debian archive, pip usable system-wide as in the
# official image (no EXTERNALLY-MANAGED), `python`/`pip` on PATH; docs, man pages and locales
# left out. Tagged with the exact FROM name, so the Dockerfile builds unchanged.
build_base_standin() {
  local name=$1 rootfs ctr
  rootfs="$IMAGE_DIR/base-bookworm-python3-r$BASE_RECIPE_VERSION.tar"
  command -v mmdebstrap >/dev/null || {
    log "mmdebstrap not found: install Debian's mmdebstrap (make packages) to make the base image stand-in"
    return 3
  }
  if [ ! -f "$rootfs" ]; then
    step "making the stand-in for $name: Debian bookworm + python3 + pip (mmdebstrap)" \
      mmdebstrap --quiet --variant=minbase --include=python3,python3-pip,ca-certificates \
      --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
      --aptopt='APT::Install-Recommends "false"' \
      --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
      --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
      --dpkgopt='path-exclude=/usr/share/locale/*' \
      --customize-hook='rm -f "$1"/usr/lib/python3.*/EXTERNALLY-MANAGED' \
      --customize-hook='ln -sf /usr/bin/python3 "$1"/usr/local/bin/python' \
      --customize-hook='ln -sf /usr/bin/pip3 "$1"/usr/local/bin/pip' \
      bookworm "$rootfs.tmp" "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" \
      >"$IMAGE_DIR/mmdebstrap.log" 2>&1 || { tail -20 "$IMAGE_DIR/mmdebstrap.log" >&2; return 1; }
    mv "$rootfs.tmp" "$rootfs"
  fi
  ctr=$(buildah_cmd from --quiet scratch)
  step "importing the stand-in rootfs as $name" buildah_cmd add --quiet "$ctr" "$rootfs" /
  buildah_cmd config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 --cmd '["python3"]' \
    --label org.opencontainers.image.title="local stand-in for $name" \
    --label org.opencontainers.image.description="Debian bookworm minbase with Debian's python3 and pip, made by hack/build-components.sh (mmdebstrap); not the official image" \
    "$ctr"
  buildah_cmd commit --quiet --rm "$ctr" "$name" >/dev/null
}

operator_image_name() {
  local version
  version=$(awk -F'"' '/^__version__/{print $2}' "$REPO_ROOT/src/gpu_operator/__init__.py")
  echo "ghcr.io/gpu-operator/gpu-operator:v$version"
}

build_image() {
  command -v buildah >/dev/null || { log "buildah not found: install Debian's buildah (make packages)"; return 3; }
  mkdir -p "$IMAGE_DIR"
  local name base archive="$IMAGE_DIR/gpu-operator.oci.tar" size key
  name=$(operator_image_name)
  # What the build reads; unchanged since the last build: nothing to do. (Not buildah's layer
  # cache: buildah 1.28 reuses a `RUN --mount=...,from=<stage>` step even when that stage
  # changed, so the final image would keep the old wheels.)
  key=$(cd "$REPO_ROOT" && find Dockerfile .dockerignore pyproject.toml setup.py README.md src templates \
    -type f ! -name '*.pyc' ! -path '*/__pycache__/*' ! -path '*.egg-info/*' -print0 |
    sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)
  if [ -f "$archive" ] && [ "$(cat "$archive.key" 2>/dev/null)" = "$key" ] &&
    buildah_cmd inspect --type image "$name" >/dev/null 2>&1; then
    log "image $name current (sources unchanged): $archive"
    echo "$archive"
    return
  fi
  for base in $(from_images); do
    if buildah_cmd inspect --type image "$base" >/dev/null 2>&1; then
      log "base image $base: the local stand-in is in the store"
    else
      build_base_standin "$base"
    fi
  done
  # The host's CA bundle is bound over the image's for the RUN steps only (never in a layer):
  # pip reaches PyPI through whatever TLS proxy this machine trusts.
  local ca=() bundle=/etc/ssl/certs/ca-certificates.crt
  [ -f "$bundle" ] && ca=(--volume "$bundle:$bundle:ro")
  step "building $name from Dockerfile (buildah bud, no image pulled)" \
    buildah_cmd bud --quiet --layers=false --pull=never --isolation chroot --network host "${ca[@]}" \
    -f "$REPO_ROOT/Dockerfile" -t "$name" "$REPO_ROOT"
  rm -f "$archive.tmp"
  step "writing $archive" buildah_cmd push --quiet "$name" "oci-archive:$archive.tmp:$name"
  mv "$archive.tmp" "$archive"
  echo "$key" >"$archive.key"
  buildah_cmd rmi --prune >/dev/null 2>&1 || true  # the previous builds' untagged images
  size=$(buildah_cmd images --format '{{.Size}}' "$name" | head -1)
  log "image $name: $size in the store, $(($(stat -c %s "$archive") >> 20)) MiB archive"
  echo "$archive"
}

# Stand-ins for NVIDIA's operand images (gpu_operator.testenv.standins says which, and what they
# run): one image FROM the project's, then each stand-in named and given its entrypoint; one OCI
# archive for all of them, images/standins.oci.tar.
build_standins() {
  local py=${PYTHON:-$REPO_ROOT/.venv/bin/python} base ctx="$IMAGE_DIR/standins-context" list
  local archive id stubs
  [ -x "$py" ] || py=python3
  base=$(operator_image_name)
  buildah_cmd inspect --type image "$base" >/dev/null 2>&1 || { log "build the image first: make image"; return 3; }
  archive="$IMAGE_DIR/standins.oci.tar"
  rm -rf "$ctx" && mkdir -p "$ctx"
  list=$(PYTHONPATH="$REPO_ROOT/src" "$py" -m gpu_operator.testenv.standins "$ctx" "$base")
  # The stub driver the driver stand-in lays out, compiled here (gcc): the image has no compiler.
  stubs=$(PYTHONPATH="$REPO_ROOT/src" "$py" -m gpu_operator.sim.stubdriver build "$ctx/stubdriver")
  # Current when built FROM this very image with these very names, entrypoints and stubs.
  id="$(buildah_cmd images --noheading --no-trunc --format '{{.ID}}' "$base") $(sha256sum <<<"$list" | cut -c1-16) $stubs"
  if [ -f "$archive" ] && [ "$(cat "$archive.id" 2>/dev/null)" = "$id" ]; then
    rm -rf "$ctx"
    log "stand-ins current for $base: $archive"
    echo "$archive"
    return
  fi
  step "building the stand-ins' common image FROM $base" \
    buildah_cmd bud --quiet --layers --pull=never --isolation chroot -f "$ctx/Containerfile" \
    -t localhost/testenv/standins:latest "$ctx"
  # One OCI layout holding every stand-in: the common image's layers once, and for each
  # stand-in a config (its entrypoint, environment, title) and a manifest of its own.
  rm -rf "$ctx/layout" && mkdir -p "$ctx/layout"
  step "writing the stand-ins' common image to an OCI layout" \
    buildah_cmd push --quiet --disable-compression localhost/testenv/standins:latest \
    "oci:$ctx/layout:localhost/testenv/standins:latest"
  printf '%s\n' "$list" >"$ctx/standins.list"
  step "naming $(wc -l <"$ctx/standins.list") stand-ins (SIMULATED) in it" \
    env PYTHONPATH="$REPO_ROOT/src" "$py" -m gpu_operator.testenv.ocilayout "$ctx/layout" \
    localhost/testenv/standins:latest "$ctx/standins.list"
  tar -C "$ctx/layout" -cf "$archive.tmp" . && mv "$archive.tmp" "$archive"
  echo "$id" >"$archive.id"
  rm -rf "$ctx"
  log "stand-ins: $(($(stat -c %s "$archive") >> 20)) MiB archive"
  echo "$archive"
}

case "${1:-all}" in
  image) build_image ;;
  standins) build_standins ;;
  all) mkdir -p "$BIN" "$WORK"; build_etcd; build_kwok; build_helm; build_toxiproxy; build_k8s; echo "$BIN" ;;
  etcd) mkdir -p "$BIN" "$WORK"; build_etcd; echo "$BIN" ;;
  kwok) mkdir -p "$BIN" "$WORK"; build_kwok; echo "$BIN" ;;
  kubernetes) mkdir -p "$BIN" "$WORK"; build_k8s; echo "$BIN" ;;
  helm) mkdir -p "$BIN" "$WORK"; build_helm; echo "$BIN" ;;
  toxiproxy) mkdir -p "$BIN" "$WORK"; build_toxiproxy; echo "$BIN" ;;
  nodes)
    mkdir -p "$NODE_BIN" "$NODE_WORK"
    build_containerd; build_node_tools; build_node_images
    echo "$NODE_DIR"
    ;;
  *) echo "usage: $0 [all|etcd|kwok|kubernetes|helm|toxiproxy|nodes|image|standins]" >&2; exit 2 ;;
esac
