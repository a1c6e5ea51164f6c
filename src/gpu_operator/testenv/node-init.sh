#!/usr/bin/env bash
# One real testenv node, run as PID 1 of its own PID namespace with private mount and network
# namespaces (started by gpu_operator.testenv.realnodes through `unshare`). Usage:
#   node-init.sh NODE_DIR/node.env
# It gives the node its own /run, /var/lib and /var/log (the node directory bound on
# /var/lib/kubelet, /run/cdi, /run/nvidia, the simulated-GPU marker dir and the simulated host
# driver's root), takes the veth the
# harness moved in as eth0, then runs containerd (images imported from archives, never pulled),
# kube-proxy and the kubelet. When any of them exits, so does this script, and with it every
# process of the node (the kernel kills a PID namespace with its init).
set -euo pipefail
# shellcheck disable=SC1090
source "$1"
export PATH="$NODE_BIN:$K8S_BIN:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
log() { echo "$(date +%H:%M:%S.%3N) node-init: $*"; }
trap 'exit 0' TERM INT

# Mounts: made shared inside this namespace (kubelet and runc need rshared for Bidirectional
# volumes) while staying slaves of the host, so nothing mounted here appears outside.
mount --make-rshared /
mount -t tmpfs -o mode=755 node-run /run
mount -t tmpfs -o mode=755 node-var-lib /var/lib
mkdir -p /run/cdi /run/nvidia "$SIM_DIR" /run/containerd /var/lib/kubelet /var/lib/cni
mount --bind "$NODE_DIR/kubelet" /var/lib/kubelet
mount --bind "$NODE_DIR/cdi" /run/cdi
mount --bind "$NODE_DIR/nvidia" /run/nvidia
mount --bind "$NODE_DIR/gpu-operator-sim" "$SIM_DIR"
mount --bind "$NODE_DIR/var-log" /var/log
mkdir -p "$HOST_DRIVER_DIR"
mount --bind "$NODE_DIR/host-driver" "$HOST_DRIVER_DIR"
# NVIDIA's toolkit writes the container runtime's config under /etc/containerd: the node's own.
mkdir -p /etc/containerd
mount --bind "$NODE_DIR/etc-containerd" /etc/containerd
# A Linux host has /lib/modules, and NVIDIA's VFIO manager mounts it (hostPath type Directory);
# a machine without one (a container-like VM) gets an empty one, the node's only mark outside.
[ -d /lib/modules ] || mkdir -p /lib/modules
: >/run/xtables.lock

# The node runs in its own cgroup namespace, rooted at its cgroup in every hierarchy (the
# harness put it there); mounted afresh here, the hierarchies show that root as `/`, so runc's
# /k8s.io/<container> cgroups are created inside the node's cgroup.
while read -r _ mnt fstype opts _; do
  case "$fstype" in
    cgroup | cgroup2) umount "$mnt" && mount -t "$fstype" -o "$opts" "$fstype" "$mnt" ;;
  esac
done < <(grep -E '^[^ ]+ /sys/fs/cgroup/?[^ ]* cgroup2? ' /proc/self/mounts)

# Network: loopback, the harness veth as eth0, routes to the other nodes' pods. Service
# addresses get a route to an empty bridge (a device that leads nowhere; this kernel has no
# `dummy`), so a host-network client can connect() and kube-proxy's DNAT then rewrites the
# destination. There is no default route.
ip link set lo up
for _ in $(seq 200); do ip link show "$NODE_VETH" >/dev/null 2>&1 && break; sleep 0.05; done
ip link set "$NODE_VETH" name eth0
ip addr add "$NODE_IP/$NODE_PREFIX_LEN" dev eth0
ip link set eth0 up
ip link add svc0 type bridge
ip link set svc0 up
ip route add "$SERVICE_CIDR" dev svc0 src "$NODE_IP"
for route in $PEER_ROUTES; do ip route add "${route%@*}" via "${route#*@}" dev eth0; done
sysctl -qw net.ipv4.ip_forward=1

log "starting containerd"
containerd --config "$NODE_DIR/containerd.toml" >>"$NODE_DIR/logs/containerd.log" 2>&1 &
for _ in $(seq 300); do
  ctr --address "/run/containerd/containerd.sock" version >/dev/null 2>&1 && break
  sleep 0.05
done
for archive in $IMAGES; do
  ctr --address /run/containerd/containerd.sock -n k8s.io images import --local "$archive" >/dev/null
done
log "images imported: $IMAGES"

kube-proxy --config "$NODE_DIR/kube-proxy.yaml" >>"$NODE_DIR/logs/kube-proxy.log" 2>&1 &
kubelet --config "$NODE_DIR/kubelet.yaml" --kubeconfig "$NODE_DIR/kubelet.kubeconfig" \
  --hostname-override "$NODE_NAME" --node-ip "$NODE_IP" --v=1 \
  >>"$NODE_DIR/logs/kubelet.log" 2>&1 &
log "kubelet and kube-proxy started"
touch "$NODE_DIR/started"

set +e
wait -n
rc=$?
log "a node process exited with code $rc; stopping the node"
exit "$rc"
