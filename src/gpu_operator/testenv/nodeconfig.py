"""What a real testenv node is made of, as plain data: its addresses, directories, labels and the
configuration files of its kubelet, containerd, CNI bridge and kube-proxy.

Everything here is pure (no I/O), so the settings that make a kubelet run in a namespace on this
kind of VM are unit-tested; `realnodes` writes these files and runs the processes.

Addresses: the harness owns one bridge per cluster in the root network namespace, on
`10.213.<slot>.0/24` (`.1` is the bridge and the API server, nodes from `.10`); each node's pods
live on `10.244.<i>.0/24` inside the node's own network namespace. No namespace gets a default
route, so nothing a node or pod sends can leave the machine.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_operator import labels

from . import nodes

BRIDGE_PREFIX = "gpuopbr"
VETH_PREFIX = "gpuop"
NODE_NET = "10.213.{slot}.0/24"
SLOTS = range(0, 256)
FIRST_NODE_HOST = 10
CLUSTER_CIDR = "10.244.0.0/16"
POD_CIDR = "10.244.{index}.0/24"
SERVICE_CIDR = "10.96.0.0/16"
NODE_NAME = "real-node-{index}"
DEFAULT_GPUS = ("a100-40gb:8", "h100-80gb:8")

REAL_NODE_LABEL = "gpu-operator.testenv/real-node"
SIMULATED_GPUS_ANNOTATION = labels.SIMULATED_GPUS_ANNOTATION
# On the node: the simulated GPU profile (`a100-40gb:8`) in <SIM_DIR_ON_NODE>/profile.
SIM_DIR_ON_NODE = labels.SIMULATED_GPUS_DIR
SIM_PROFILE_FILE = labels.SIMULATED_GPUS_PROFILE
# On the node: a SIMULATED driver "preinstalled" at a root of its own (GKE's layout: lib64/,
# bin/, as at /home/kubernetes/bin/nvidia), for policies with the driver disabled and
# hostPaths.driverInstallDir naming it. The driver container's root is /run/nvidia/driver.
HOST_DRIVER_ON_NODE = labels.SIMULATED_HOST_DRIVER_ROOT
# The runtime handler NVIDIA's toolkit adds to containerd (RuntimeClass `nvidia`): here the
# testenv's stand-in (nvidia_runtime.py), which gives containers the node's simulated NVML.
NVIDIA_RUNTIME = "nvidia"

CONTAINERD_SOCKET = "/run/containerd/containerd.sock"
CGROUP_TOP = "gpu-operator-testenv"
KUBELET_PORT = 10250
# Mounted into every node's image store before its kubelet starts (names as in the archives).
PAUSE_IMAGE = "localhost/testenv/pause:{version}"
SHELL_IMAGE = "localhost/testenv/shell:{version}"


class NodeConfigError(ValueError):
    """A real-node request that cannot be honoured; the message names the option and the fix."""


@dataclass(frozen=True)
class Network:
    """The harness bridge of one cluster in the root network namespace."""

    slot: int
    bridge: str
    subnet: str
    gateway: str  # the bridge's address, where the API server listens for the nodes

    @property
    def prefix_len(self) -> int:
        return ipaddress.ip_network(self.subnet).prefixlen

    def to_json(self) -> dict[str, Any]:
        return {"slot": self.slot, "bridge": self.bridge, "subnet": self.subnet,
                "gateway": self.gateway}  # fmt: skip

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Network:
        return cls(int(data["slot"]), str(data["bridge"]), str(data["subnet"]),
                   str(data["gateway"]))  # fmt: skip


@dataclass(frozen=True)
class RealNode:
    """One planned real node: where it lives on disk and on the harness network."""

    name: str
    index: int
    ip: str
    pod_cidr: str
    gpus: str  # a GPU_OPERATOR_SIMULATE spec, e.g. "a100-40gb:8"
    dir: Path
    host_veth: str  # the root-namespace end, attached to the bridge
    node_veth: str  # the end moved into the node (renamed eth0 there)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "index": self.index, "ip": self.ip, "pod_cidr": self.pod_cidr,
            "gpus": self.gpus, "dir": str(self.dir), "host_veth": self.host_veth,
            "node_veth": self.node_veth,
        }  # fmt: skip

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RealNode:
        return cls(
            name=str(data["name"]), index=int(data["index"]), ip=str(data["ip"]),
            pod_cidr=str(data["pod_cidr"]), gpus=str(data["gpus"]), dir=Path(data["dir"]),
            host_veth=str(data["host_veth"]), node_veth=str(data["node_veth"]),
        )  # fmt: skip


def network_for_slot(slot: int) -> Network:
    if slot not in SLOTS:
        raise NodeConfigError(f"network slot {slot} outside {SLOTS.start}..{SLOTS.stop - 1}")
    subnet = ipaddress.ip_network(NODE_NET.format(slot=slot))
    return Network(slot, f"{BRIDGE_PREFIX}{slot}", str(subnet), str(subnet.network_address + 1))


def pick_slot(used_addresses: Sequence[str], used_links: Sequence[str]) -> int:
    """The first slot whose subnet holds no address on this host and whose bridge name is free.

    `used_addresses` are CIDRs as `ip -o addr` prints them (`10.213.0.1/24`)."""
    taken: set[int] = set()
    for cidr in used_addresses:
        try:
            iface = ipaddress.ip_interface(cidr)
        except ValueError:
            continue
        for slot in SLOTS:
            if iface.network.overlaps(ipaddress.ip_network(NODE_NET.format(slot=slot))):
                taken.add(slot)
    for link in used_links:
        match = re.fullmatch(rf"{BRIDGE_PREFIX}(\d+)", link)
        if match:
            taken.add(int(match.group(1)))
    for slot in SLOTS:
        if slot not in taken:
            return slot
    raise NodeConfigError("no free 10.213.X.0/24 network for the real nodes' bridge")


# A spec item that names the node's NVLink fabric, not GPUs (gpu_operator.sim.nvml.profiles'
# FABRIC_ITEM: testenv sits below the simulation in the layers; a test keeps them equal).
FABRIC_ITEM = "fabric="


def parse_gpus(text: str | None, known_profiles: Sequence[str]) -> list[str]:
    """`--real-node-gpus`: one simulation spec per node, comma-separated (`a100-40gb:8,t4:1`);
    `+` joins several models on one node (`a100-40gb:4+t4:2`), or a node's NVLink fabric to its
    GB200/GB300 GPUs (`gb200:4+fabric=<cluster uuid>.<clique id>`, see
    :mod:`gpu_operator.sim.nvml.fabric`). Nodes beyond the list cycle it."""
    if text is None or not text.strip():
        return list(DEFAULT_GPUS)
    specs = []
    for raw in text.split(","):
        parts = [p.strip() for p in raw.split("+") if p.strip()]
        if not parts:
            raise NodeConfigError(f"--real-node-gpus {text!r}: empty entry; e.g. a100-40gb:8,t4:1")
        for part in parts:
            if part.startswith(FABRIC_ITEM):
                continue  # the simulated NVML checks it when the node's agents start
            name, _, count = part.partition(":")
            if name not in known_profiles:
                raise NodeConfigError(
                    f"--real-node-gpus: unknown GPU profile {name!r}; known: "
                    f"{', '.join(known_profiles)}"
                )
            if count and not (count.isdigit() and int(count) > 0):
                raise NodeConfigError(
                    f"--real-node-gpus: bad count in {part!r}; use PROFILE:COUNT, e.g. {name}:8"
                )
        specs.append(",".join(parts))
    return specs


def plan_nodes(
    count: int, gpus: Sequence[str], network: Network, nodes_dir: Path
) -> list[RealNode]:
    """Names, addresses and directories of `count` real nodes (GPU specs cycled over them)."""
    if count < 0:
        raise NodeConfigError(f"--real-nodes {count}: must be 0 or more")
    subnet = ipaddress.ip_network(network.subnet)
    if count > subnet.num_addresses - FIRST_NODE_HOST - 1:
        raise NodeConfigError(f"--real-nodes {count}: at most {subnet.num_addresses - 11}")
    if count and not gpus:
        raise NodeConfigError("--real-node-gpus: give at least one profile, e.g. a100-40gb:8")
    planned = []
    for i in range(count):
        name = NODE_NAME.format(index=i)
        planned.append(
            RealNode(
                name=name,
                index=i,
                ip=str(subnet.network_address + FIRST_NODE_HOST + i),
                pod_cidr=POD_CIDR.format(index=i),
                gpus=gpus[i % len(gpus)],
                dir=nodes_dir / name,
                host_veth=f"{VETH_PREFIX}{network.slot}h{i}",
                node_veth=f"{VETH_PREFIX}{network.slot}n{i}",
            )
        )
    return planned


def cluster_id(state_dir: Path) -> str:
    """Stable per state dir, so a later `down` finds what a crashed `up` left (cgroups)."""
    return hashlib.sha256(str(state_dir).encode()).hexdigest()[:12]


def cluster_cgroups(mounts: str, self_cgroup: str, state_dir: Path) -> list[str]:
    """The cgroup directory, in every mounted hierarchy, that holds one cluster's nodes: below
    the harness's own cgroup there (so its accounting and limits cover the nodes), at
    `gpu-operator-testenv/<cluster id>`. Each node runs in a cgroup namespace rooted at
    `<that>/<node>`, so runc's `/k8s.io/<container>` cgroups land inside it too.

    `mounts` is /proc/self/mounts and `self_cgroup` /proc/self/cgroup."""
    own: dict[str, str] = {}
    for line in self_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for controller in parts[1].split(",") if parts[1] else [""]:
                own[controller] = parts[2]
    dirs = []
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 4 or fields[2] not in ("cgroup", "cgroup2"):
            continue
        mountpoint = fields[1]
        if fields[2] == "cgroup2":
            key = ""
        else:
            options = fields[3].split(",")
            named = [o for o in options if o.startswith("name=")]
            key = named[0] if named else next((o for o in options if o in own), "")
            if not key:
                continue
        base = own.get(key, "/").strip("/")
        parts = [mountpoint, base, CGROUP_TOP, cluster_id(state_dir)]
        dirs.append("/".join(p.strip("/") for p in parts if p.strip("/")))
    return sorted({"/" + d for d in dirs})


def node_labels(node: RealNode) -> dict[str, str]:
    """What kwok GPU nodes carry (NFD's OS, kernel and NVIDIA PCI labels, as for the simulated
    host the stack is told it runs on) plus the marker that tells real from kwok nodes."""
    manifest = nodes.node_manifest(node.name, gpu=True)
    labels = dict(manifest["metadata"]["labels"])
    labels[REAL_NODE_LABEL] = "true"
    return labels


def node_annotations(node: RealNode) -> dict[str, str]:
    return {SIMULATED_GPUS_ANNOTATION: node.gpus}


def kubelet_config(node: RealNode, *, ca_file: Path, resolv_conf: Path) -> dict[str, Any]:
    """KubeletConfiguration for a kubelet in a namespace on a VM without CAP_SYS_RESOURCE."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": node.ip,
        "port": KUBELET_PORT,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca_file)},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{CONTAINERD_SOCKET}",
        # cgroups written directly (no systemd), no QoS tree, nothing reserved or enforced:
        # the node's cgroup namespace keeps every container inside the node's cgroup.
        "cgroupDriver": "cgroupfs",
        "cgroupsPerQOS": False,
        "enforceNodeAllocatable": [],
        "failCgroupV1": False,
        "failSwapOn": False,
        # The VM lacks CAP_SYS_RESOURCE: a negative oom_score_adj (default -999) cannot be set.
        "oomScoreAdj": 0,
        # kube-proxy owns the node's iptables; the kubelet's own chains are not needed.
        "makeIPTablesUtilChains": False,
        # Never evict or garbage-collect images on a shared disk that is fuller than a node's.
        "evictionHard": {},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "localStorageCapacityIsolation": True,  # false breaks /stats/summary
        "serializeImagePulls": False,
        "resolvConf": str(resolv_conf),
        "clusterDomain": "cluster.local",
        "volumePluginDir": "/var/lib/kubelet/volume-plugins",
        "registerNode": True,
        "maxPods": 110,
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
    }


def kube_proxy_config(node: RealNode, kubeconfig: Path) -> dict[str, Any]:
    """kube-proxy (iptables mode) inside the node's network namespace: it DNATs the
    `kubernetes` Service to the API server on the harness bridge."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": node.name,
        "mode": "iptables",
        "clusterCIDR": CLUSTER_CIDR,
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        "oomScoreAdj": 0,
        # 0 = leave the kernel's conntrack settings alone (global ones are read-only in a netns).
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
    }


def cni_conflist(node: RealNode) -> dict[str, Any]:
    """A bridge per node with host-local IPAM and masquerading; pods' default route ends in the
    node's namespace, which has no route off the machine."""
    return {
        "cniVersion": "1.0.0",
        "name": "testenv",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": True,
                "ipMasq": True,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": node.pod_cidr}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def containerd_config(
    node: RealNode,
    *,
    pause_image: str,
    cni_conf_dir: Path,
    cni_bin_dir: str,
    runc: str,
    nvidia_runtime: str,
) -> dict[str, Any]:
    """containerd v2 (config version 4) with CRI, CDI from /var/run/cdi, runc on cgroupfs, and
    the `nvidia` handler (the testenv's stand-in for NVIDIA's runtime, see nvidia_runtime.py)."""
    runtime = "io.containerd.cri.v1.runtime"
    return {
        "version": 4,
        "root": str(node.dir / "containerd"),
        "state": "/run/containerd",
        "oom_score": 0,
        "plugins": {
            "io.containerd.server.v1.grpc": {"address": CONTAINERD_SOCKET},
            "io.containerd.server.v1.ttrpc": {"address": f"{CONTAINERD_SOCKET}.ttrpc"},
            "io.containerd.cri.v1.images": {
                "snapshotter": "overlayfs",
                # Imported with `ctr images import`, never pulled (no registry is reachable).
                "pinned_images": {"sandbox": pause_image},
            },
            runtime: {
                # Without this runc fails to start the pause container ("can't get final
                # child's PID from pipe: EOF"): the VM lacks CAP_SYS_RESOURCE.
                "restrict_oom_score_adj": True,
                "disable_apparmor": True,
                # Pod netns mounts live in the node's private mount namespace and vanish with it.
                "netns_mounts_under_state_dir": True,
                "cdi_spec_dirs": ["/var/run/cdi"],
                "containerd": {
                    "default_runtime_name": "runc",
                    "runtimes": {
                        "runc": {
                            "runtime_type": "io.containerd.runc.v2",
                            "options": {"BinaryName": runc, "SystemdCgroup": False},
                        },
                        NVIDIA_RUNTIME: {
                            "runtime_type": "io.containerd.runc.v2",
                            "options": {"BinaryName": nvidia_runtime, "SystemdCgroup": False},
                        },
                    },
                },
                "cni": {"bin_dirs": [cni_bin_dir], "conf_dir": str(cni_conf_dir)},
            },
            "io.containerd.grpc.v1.cri": {"stream_server_address": "127.0.0.1"},
        },
    }


def init_env(
    node: RealNode,
    network: Network,
    *,
    peers: Sequence[RealNode],
    k8s_bin: Path,
    node_bin: Path,
    images: Sequence[Path],
) -> dict[str, str]:
    """The variables the in-namespace init script (node-init.sh) reads."""
    routes = [f"{p.pod_cidr}@{p.ip}" for p in peers if p.name != node.name]
    return {
        "NODE_NAME": node.name,
        "NODE_DIR": str(node.dir),
        "NODE_IP": node.ip,
        "NODE_PREFIX_LEN": str(network.prefix_len),
        "NODE_VETH": node.node_veth,
        "SERVICE_CIDR": SERVICE_CIDR,
        "PEER_ROUTES": " ".join(routes),
        "K8S_BIN": str(k8s_bin),
        "NODE_BIN": str(node_bin),
        "IMAGES": " ".join(str(p) for p in images),
        "SIM_DIR": SIM_DIR_ON_NODE,
        "HOST_DRIVER_DIR": HOST_DRIVER_ON_NODE,
    }


def nvidia_runtime_wrapper(python: str, script: Path, runc: str) -> str:
    """The executable containerd runs as the `nvidia` handler's runtime binary."""
    return (
        "#!/bin/sh\n# testenv stand-in for NVIDIA's container runtime (see nvidia_runtime.py)\n"
        f'exec {shlex.quote(python)} -I {shlex.quote(str(script))} {shlex.quote(runc)} "$@"\n'
    )


def runc_wrapper(python: str, script: Path, runc: str) -> str:
    """The executable containerd runs as the `runc` handler's runtime binary: runc, with the
    simulated GPUs' kernel view added at `create` (the shim's other calls go straight on)."""
    q = shlex.quote
    return (
        "#!/bin/sh\n# runc, plus what a GPU node's kernel shows (see nvidia_runtime.py)\n"
        f'case " $* " in *" create "*) exec {q(python)} -I {q(str(script))} --kernel-only '
        f'{q(runc)} "$@" ;; esac\n'
        f'exec {q(runc)} "$@"\n'
    )


def env_file(env: Mapping[str, str]) -> str:
    """Shell-sourceable `KEY='value'` lines (values single-quoted, so nothing is expanded)."""
    lines = []
    for key, value in env.items():
        if not re.fullmatch(r"[A-Z_][A-Z0-9_]*", key):
            raise NodeConfigError(f"bad variable name {key!r}")
        lines.append(f"{key}='" + value.replace("'", "'\\''") + "'")
    return "\n".join(lines) + "\n"


# -- TOML (containerd reads nothing else; the standard library only parses it) ----------------
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else json.dumps(key)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")


def to_toml(doc: Mapping[str, Any]) -> str:
    """Nested mappings of str/int/bool/lists as TOML tables (scalars before subtables)."""
    out: list[str] = []

    def emit(table: Mapping[str, Any], path: tuple[str, ...]) -> None:
        scalars = [(k, v) for k, v in table.items() if not isinstance(v, Mapping)]
        tables = [(k, v) for k, v in table.items() if isinstance(v, Mapping)]
        if path and (scalars or not tables):
            out.append("[" + ".".join(_key(p) for p in path) + "]")
        for key, value in scalars:
            out.append(f"{_key(key)} = {_value(value)}")
        for key, sub in tables:
            emit(sub, (*path, key))

    emit(doc, ())
    return "\n".join(out) + "\n"
