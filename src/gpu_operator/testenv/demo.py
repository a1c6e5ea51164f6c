"""`make demo`: a simulated GPU cluster running the whole stack, left up for you to explore.

Starts testenv with two real nodes (kubelet + containerd, where this machine can run them: the
stack runs there in real containers, from the project's image and the SIMULATED stand-ins for
NVIDIA's images) and four kwok GPU nodes of different simulated models. For the kwok nodes, which
run no containers, the node agents run as background processes tied to the cluster (`hack/testenv
down` ends them too): a discovery agent, the device plugin's simulated capacity
(`--kwok-capacity`: the node's `nvidia.com/gpu` from the plugin's own computation), the MIG
manager and the DRA plugin. It applies examples/clusterpolicy.yaml, waits for `ready`, runs one
GPU pod per GPU node and prints what each node is and has, and where its GPU pod runs.
`--short` (what `make test` runs) does the same and then takes the cluster down again.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from gpu_operator.kube import Kube
from gpu_operator.testenv import binaries, gpufaults, nodes, realnodes
from gpu_operator.testenv.cluster import Cluster, default_state_dir, start
from gpu_operator.testenv.processes import spawn

REPO = Path(__file__).resolve().parents[3]
NAMESPACE = "gpu-operator"
WORKLOADS = "default"  # where the demo's GPU pods run
GPU_POD = "gpu-pod-{node}"
# GPU health remediation on, with delays short enough to watch a fault come and go.
QUIET_PERIOD = "10s"
HEALTH: dict[str, Any] = {
    "enabled": True,
    "recoveryDelay": "30s",
    "signals": {"quietPeriod": QUIET_PERIOD},
}
REAL_NODES = 2  # beside the kwok ones, where this machine can run them
# name -> (simulated GPUs, OS id, OS version)
GPU_NODES = {
    "gpu-a100": ("a100-40gb:8", "ubuntu", "22.04"),
    "gpu-h100": ("h100-80gb:8", "ubuntu", "22.04"),
    "gpu-t4": ("t4:1", "ubuntu", "24.04"),
    "gpu-l4": ("l4:2", "rhel", "9.4"),
}


def _say(msg: str) -> None:
    print(msg, flush=True)


def _run_in_background(cluster: Cluster, name: str, argv: list[str], env: dict[str, str]) -> None:
    os.environ.update(env)  # spawn inherits this process's environment
    try:
        _, record = spawn(
            name,
            argv,
            cluster.state_dir / "logs" / f"{name}.log",
            die_with_parent=False,
            cwd=REPO,
        )
    finally:
        for key in env:
            os.environ.pop(key, None)
    cluster.adopt(record)


def _wait(what: str, probe: Any, timeout: float = 180.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.5)
    raise SystemExit(f"demo: timed out waiting for {what}")


def _established(kube: Kube) -> bool:
    crd = kube.get("CustomResourceDefinition", "clusterpolicies.nvidia.com") or {}
    return any(
        c.get("type") == "Established" and c.get("status") == "True"
        for c in (crd.get("status") or {}).get("conditions") or []
    )


def gpu_pod(node: str, real: bool = False) -> dict[str, Any]:
    """A pod asking for one GPU on ``node`` (tolerating the GPU taint, as the admission plugin
    ExtendedResourceToleration would add it). On a real node it runs the local shell image
    (nothing is pulled) and prints the GPU the device plugin gave it."""
    if real:
        container = {
            "name": "cuda",
            "image": binaries.node_image_name("shell"),
            "imagePullPolicy": "Never",
            "command": [
                "sh",
                "-c",
                "echo NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES; sleep 3600",
            ],
            "resources": {"limits": {"nvidia.com/gpu": "1"}},
        }
    else:
        container = {
            "name": "cuda",
            "image": "nvcr.io/nvidia/cuda:12.8.0-base-ubuntu22.04",
            "command": ["nvidia-smi", "-L"],
            "resources": {"limits": {"nvidia.com/gpu": "1"}},
        }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": GPU_POD.format(node=node), "namespace": WORKLOADS},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
            "terminationGracePeriodSeconds": 1,
            "containers": [container],
        },
    }


def gpu_pod_state(pod: dict[str, Any] | None) -> str:
    """``Running`` once bound and started; else the phase, or why it is not scheduled."""
    if not pod:
        return "-"
    status = pod.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return str(condition.get("reason") or "Unschedulable")
    return str(status.get("phase") or "Pending")


def node_table(kube: Kube, real: Sequence[str] = ()) -> str:
    """One row per node; KIND says which nodes are real (kubelet and containerd) and which kwok."""
    pods = kube.list_objects("Pod", NAMESPACE)
    workloads = {p["metadata"]["name"]: p for p in kube.list_objects("Pod", WORKLOADS)}
    rows = [("NODE", "KIND", "PRODUCT", "GPUS", "MEMORY", "DRIVER", "CUDA", "MIG", "TAINT",
             "READY", "ALLOCATABLE", "GPU POD")]  # fmt: skip
    for node in sorted(kube.list_objects("Node"), key=lambda n: n["metadata"]["name"]):
        name = node["metadata"]["name"]
        labels = node["metadata"].get("labels") or {}
        gpu = labels.get("nvidia.com/gpu.present") == "true"
        taint = any(t.get("key") == "nvidia.com/gpu" for t in node["spec"].get("taints") or [])
        on_node = [p for p in pods if p["spec"].get("nodeName") == name]
        ready = sum(
            1 for p in on_node
            if any(c["type"] == "Ready" and c["status"] == "True"
                   for c in (p.get("status") or {}).get("conditions") or [])
        )  # fmt: skip
        mig = {"true": "", "false": "no"}.get(labels.get("nvidia.com/mig.capable", ""), "-")
        if mig == "":
            layout = labels.get("nvidia.com/mig.config", "?")
            mig = f"{layout} ({labels.get('nvidia.com/mig.config.state', 'pending')})"
        rows.append((
            name,
            "real" if name in real else "kwok",
            labels.get("nvidia.com/gpu.product", "-" if not gpu else "?"),
            labels.get("nvidia.com/gpu.count", "-"),
            f"{labels['nvidia.com/gpu.memory']} MiB" if "nvidia.com/gpu.memory" in labels else "-",
            labels.get("nvidia.com/cuda.driver-version.full", "-"),
            labels.get("nvidia.com/cuda.runtime-version.full", "-"),
            mig,
            "yes" if taint else "no",
            f"{ready}/{len(on_node)}" if gpu else "-",
            (node.get("status") or {}).get("allocatable", {}).get("nvidia.com/gpu", "-"),
            gpu_pod_state(workloads.get(GPU_POD.format(node=name))) if gpu else "-",
        ))  # fmt: skip
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows
    )


def slice_table(kube: Kube) -> str:
    """What each node publishes for DRA: its pool generation and its devices by kind."""
    rows = [("NODE", "DRIVER", "GENERATION", "DEVICES")]
    for s in sorted(kube.list_objects("ResourceSlice"), key=lambda s: s["spec"]["nodeName"]):
        kinds: dict[str, int] = {}
        for d in s["spec"].get("devices") or []:
            attrs = d.get("attributes") or {}
            what = (attrs.get("profile") or attrs.get("productName") or {}).get("string", "?")
            kinds[what] = kinds.get(what, 0) + 1
        rows.append((
            s["spec"]["nodeName"], s["spec"]["driver"], str(s["spec"]["pool"]["generation"]),
            ", ".join(f"{n} x {k}" for k, n in sorted(kinds.items())) or "-",
        ))  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)


def _mig_capable(gpus: str) -> bool:
    return gpus.startswith(("a100", "h100"))


def _run_stack(cluster: Cluster, t0: float) -> None:
    """The operator and the node agents in the background, the policy, and the wait for ready."""
    python = sys.executable
    real = {n.name: n.gpus for n in cluster.real.nodes} if cluster.real else {}
    gpu_nodes = {**real, **{n: gpus for n, (gpus, _, _) in GPU_NODES.items()}}
    kubeconfig = str(cluster.kubeconfig)
    with cluster.api_client() as api:
        kube = Kube(api)
        kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    _run_in_background(
        cluster, "gpu-operator",
        [python, "-m", "gpu_operator", "run", "--kubeconfig", kubeconfig,
         "--namespace", NAMESPACE, "--health-port", "0", "--metrics-port", "0"],
        {},
    )  # fmt: skip
    with cluster.api_client() as api:
        kube = Kube(api)
        # The operator installs the CRD; a policy created before the CRD is Established gets a
        # 404, so wait for the condition, not for the object.
        _wait("the ClusterPolicy CRD Established", lambda: _established(kube))
        policy = yaml.safe_load((REPO / "examples" / "clusterpolicy.yaml").read_text())
        policy["spec"]["healthRemediation"] = HEALTH  # so a fault you inject is acted on
        kube.create(policy)
        for name, (gpus, _, _) in GPU_NODES.items():
            _run_in_background(
                cluster, f"discover-{name}",
                [python, "-m", "gpu_operator", "agent", "discover",
                 "--simulate-state", str(gpufaults.kwok_state_file(cluster, name))],
                {"KUBECONFIG": kubeconfig, "NODE_NAME": name, "GPU_OPERATOR_SIMULATE": gpus,
                 "GFD_SLEEP_INTERVAL": "30s", "MIG_STRATEGY": "single"},
            )  # fmt: skip

            # The device plugin's capacity on the simulated node (kwok plays its kubelet).
            _run_in_background(
                cluster, f"device-plugin-{name}",
                [python, "-m", "gpu_operator", "agent", "device-plugin", "--kwok-capacity",
                 "--simulate-state", str(gpufaults.kwok_state_file(cluster, name))],
                {"KUBECONFIG": kubeconfig, "NODE_NAME": name, "GPU_OPERATOR_SIMULATE": gpus,
                 "MIG_STRATEGY": "single", "GPU_HEALTH_CONDITION": "true",
                 "GPU_HEALTH_QUIET_PERIOD": QUIET_PERIOD},
            )  # fmt: skip

        # MIG managers on the MIG-capable models, reading the layouts the operator deployed.
        configmap = _wait("the MIG layouts ConfigMap", lambda: kube.get(
            "ConfigMap", "default-mig-parted-config", NAMESPACE))  # fmt: skip
        layouts = cluster.state_dir / "mig-parted-config.yaml"
        layouts.write_text(next(iter(configmap["data"].values())))
        for name, (gpus, _, _) in GPU_NODES.items():
            if _mig_capable(gpus):
                _run_in_background(
                    cluster, f"mig-manager-{name}",
                    [python, "-m", "gpu_operator", "agent", "mig-manager",
                     "--simulate-state", str(gpufaults.kwok_state_file(cluster, name))],
                    {"KUBECONFIG": kubeconfig, "NODE_NAME": name, "GPU_OPERATOR_SIMULATE": gpus,
                     "CONFIG_FILE": str(layouts)},
                )  # fmt: skip

        def ready() -> bool:
            policy = kube.get("ClusterPolicy", "cluster-policy") or {}
            labelled = all(
                "nvidia.com/gpu.product" in (kube.get("Node", n) or {})["metadata"]["labels"]
                for n in gpu_nodes
            )
            mig_done = all(
                (kube.get("Node", n) or {})["metadata"]["labels"].get("nvidia.com/mig.config.state")
                == "success"
                for n, gpus in gpu_nodes.items()
                if _mig_capable(gpus)
            )
            return labelled and mig_done and (policy.get("status") or {}).get("state") == "ready"

        # Real nodes start their operands in real containers: minutes on a busy machine.
        _wait("ClusterPolicy ready and every GPU node discovered", ready, timeout=600)
        _say(f"demo: ClusterPolicy ready {time.monotonic() - t0:.1f}s after start")

        # One GPU pod per GPU node, placed by the real scheduler on the simulated capacity.
        for name in gpu_nodes:
            kube.create(gpu_pod(name, real=name in real))

        def running() -> bool:
            return all(
                gpu_pod_state(kube.get("Pod", GPU_POD.format(node=n), WORKLOADS)) == "Running"
                for n in gpu_nodes
            )

        _wait("one running GPU pod per GPU node", running, timeout=300)
        _say(f"demo: a GPU pod runs on each GPU node {time.monotonic() - t0:.1f}s after start\n")
        _say(node_table(kube, list(real)))

        # DRA: each GPU node's pool published by the DRA plugin's own process (publish-only:
        # kwok has no kubelet to serve), following the node's simulated NVML and MIG state.
        for name, (gpus, _, _) in GPU_NODES.items():
            _run_in_background(
                cluster, f"dra-plugin-{name}",
                [python, "-m", "gpu_operator", "agent", "dra-plugin", "--publish-only",
                 "--interval", "5",
                 "--simulate-state", str(gpufaults.kwok_state_file(cluster, name))],
                {"KUBECONFIG": kubeconfig, "NODE_NAME": name, "GPU_OPERATOR_SIMULATE": gpus},
            )  # fmt: skip
        _wait(
            "every GPU node's ResourceSlices",
            lambda: (
                {s["spec"]["nodeName"] for s in kube.list_objects("ResourceSlice")}
                >= set(GPU_NODES)
            ),
        )
        _say("\n" + slice_table(kube))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make demo", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--short", action="store_true", help="take the cluster down after the table (for tests)"
    )
    parser.add_argument(
        "--real-nodes",
        type=int,
        default=REAL_NODES,
        help=f"real kubelet nodes beside the kwok ones (default {REAL_NODES}; 0: kwok only)",
    )
    args = parser.parse_args(argv)
    state_dir = default_state_dir()
    _say("demo: building or finding the control-plane binaries (first time: many minutes)")
    bin_dir = binaries.ensure_binaries()
    real_nodes, archives = args.real_nodes, []
    why_not = realnodes.why_unavailable(state_dir) if real_nodes else None
    if why_not:
        _say(f"demo: no real nodes on this machine ({why_not}); kwok nodes only")
        real_nodes = 0
    if real_nodes:
        _say("demo: building or finding the real nodes' runtime, the project's image and the "
             "stand-ins (first time: many minutes)")  # fmt: skip
        binaries.ensure_node_runtime()
        archives = binaries.ensure_project_images()
    t0 = time.monotonic()
    cluster = start(state_dir, cpu_nodes=1, real_nodes=real_nodes, bin_dir=bin_dir, detach=True)
    for archive in archives:
        cluster.load_image(archive)
    cluster.create_nodes(
        [nodes.node_manifest(n, gpu=True, os_id=os_id, os_version=ver)
         for n, (_, os_id, ver) in GPU_NODES.items()]
    )  # fmt: skip
    _say(f"demo: control plane with {real_nodes} real GPU nodes ({', '.join(cluster.real_nodes)}"
         f"), {len(GPU_NODES)} kwok GPU nodes and 1 kwok CPU node up in "
         f"{time.monotonic() - t0:.1f}s")  # fmt: skip

    try:
        _run_stack(cluster, t0)
    finally:
        if args.short:
            cluster.stop(remove_state=True)
    if args.short:
        _say("\ndemo: done; the cluster is down again (--short)")
        return 0
    kubeconfig = cluster.kubeconfig
    _say(
        f"\nThe cluster stays up. Reach it with:\n  export KUBECONFIG={kubeconfig}\n"
        "  kubectl get clusterpolicy,nodes; kubectl -n gpu-operator get daemonsets\n"
        "  kubectl get resourceslices -o yaml   # the GPUs as DRA devices\n"
        "Make a GPU fall off the bus and watch the node quarantined, drained and released:\n"
        f"  gpu-operator agent simulate-fault --simulate-state "
        f"{gpufaults.kwok_state_file(cluster, 'gpu-h100')} --gpu 0 lost\n"
        "  gpu-operator health status --watch     # then: ... --gpu 0 clear\n"
        f"Logs: {cluster.state_dir / 'logs'}\nStop everything with:\n  hack/testenv down"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
