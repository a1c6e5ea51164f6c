"""DRA timings against the real local control plane (testenv) and the plugin's own sockets.

    .venv/bin/python benchmarks/bench_dra.py [--nodes 1000] [--claims 500] [--prepares 300]
        [--node-runs 30] [--parts socket,node,kwok]

Prints: ResourceSlice publication for ``--nodes`` simulated nodes of 8 A100s each, and for
``--dynamic-mig-nodes`` nodes of 8 H100s publishing every partition with the DynamicMIG gate
(wall time, API requests and writes per node for the first pass and for an unchanged second
pass, slices and their bytes); how fast the real kube-scheduler allocates ``--claims``
single-GPU template claims on kwok nodes (pods/s from the first create to the last binding);
and NodePrepareResources latency through the plugin's unix socket (a fresh claim each time,
then the checkpointed answer), for whole GPUs, for TimeSlicing claims (whose interval the stub
driver's nvidia-smi sets) and for DynamicMIG partitions (a GPU and compute instance created
in simulated NVML at Prepare, destroyed at Unprepare); and Prepare and Unprepare as a real
testenv node's kubelet calls them (``--node-runs`` pods each) for a whole GPU, an MPS claim and
a DynamicMIG partition. Figures only; nothing here gates CI.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from timing import Summary, summarize  # benchmarks/ is on sys.path when a benchmark runs

from gpu_operator import testenv
from gpu_operator.agent.dra import agent as dra_agent
from gpu_operator.agent.dra import devices as dra_devices
from gpu_operator.agent.dra import partitions
from gpu_operator.agent.dra import slices as dra_slices
from gpu_operator.agent.dra.kubelet import DraClient, LocalDraKubelet
from gpu_operator.agent.dra.mig_control import MigControl
from gpu_operator.agent.dra.mps import DaemonPod
from gpu_operator.agent.dra.mps_control import MpsControl
from gpu_operator.agent.dra.server import DraPlugin, PluginPaths
from gpu_operator.agent.dra.sharing import NvidiaSmi
from gpu_operator.agent.driver_cdi import HostDriver, find_host_driver
from gpu_operator.agent.driverroot import DeviceNodes
from gpu_operator.agent.inventory import Inventory
from gpu_operator.agent.nvml import Nvml
from gpu_operator.agent.nvml.loader import load_nvml
from gpu_operator.api import dragates
from gpu_operator.api.draconfig import GROUP_VERSION
from gpu_operator.kube import Kube
from gpu_operator.render.dra import device_classes
from gpu_operator.render.facts import DEFAULT_OPERATOR_IMAGE
from gpu_operator.sim import dra as sim_dra
from gpu_operator.sim import registration
from gpu_operator.sim.nvml import install_simulated_nvml, uninstall_simulated_nvml
from gpu_operator.sim.operands import install_driver

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.e2e import dra_node_support as dra_node  # noqa: E402
from tests.e2e.support import wait_for  # noqa: E402

NS = "bench-dra"


def row(name: str, s: Summary) -> None:
    print(f"  {name:<48} median {s.median:7.2f} ms  p99 {s.p99:7.2f} ms  max {s.max:7.2f} ms"
          f"  (n={s.n})")  # fmt: skip


def publication(kube: Kube, nodes: int, workers: int, dynamic_mig: bool = False) -> None:
    model = "h100-80gb:8" if dynamic_mig else "a100-40gb:8"
    what = f"{model}, DynamicMIG partitions" if dynamic_mig else model
    print(f"ResourceSlice publication: {nodes} nodes x {what}, {workers} publishers at once")
    started = time.monotonic()
    prefix = "bench-dyn" if dynamic_mig else "bench-node"
    inventories = {
        f"{prefix}-{i}": sim_dra.simulated_inventory(model, f"{prefix}-{i}") for i in range(nodes)
    }
    print(f"  inventories read (simulated NVML):  {time.monotonic() - started:6.1f} s")
    shape = dra_slices.dynamic_layout(kube.server_version()) if dynamic_mig else None

    def one(item: tuple[str, Inventory]) -> tuple[int, int]:
        node, inventory = item
        plan = dra_agent.publish(
            kube, node, inventory, None, None, dra_agent.pool_of(inventory, shape)
        )
        return plan.writes, plan.writes + 1  # + the list

    for label in ("first pass", "unchanged second pass"):
        started = time.monotonic()
        with ThreadPoolExecutor(workers) as pool:
            counts = list(pool.map(one, inventories.items()))
        took = time.monotonic() - started
        writes = sum(w for w, _ in counts) / nodes
        requests = sum(r for _, r in counts) / nodes
        rate = nodes / took
        print(f"  {label:<22} {took:6.1f} s  ({rate:6.0f} nodes/s)  requests/node {requests:.2f}"
              f"  writes/node {writes:.2f}")  # fmt: skip
    stored = [
        s
        for s in kube.list_objects("ResourceSlice")
        if s["spec"]["pool"]["name"].startswith(prefix)
    ]
    size = sum(len(json.dumps(s, separators=(",", ":"))) for s in stored)
    devices = sum(len(s["spec"].get("devices") or []) for s in stored)
    print(f"  slices in the API: {len(stored)} ({len(stored) / nodes:.1f}/node), {devices} devices,"
          f" {size / 1e6:.1f} MB as JSON ({size / nodes / 1e3:.1f} kB/node)")  # fmt: skip


def allocation(cluster: testenv.Cluster, kube: Kube, claims: int) -> None:
    nodes = (claims + 7) // 8
    print(f"Scheduler allocation: {claims} single-GPU claims on {nodes} kwok nodes x 8 A100")
    manifests = [testenv.node_manifest(f"alloc-node-{i}", gpu=True) for i in range(nodes)]
    cluster.create_nodes(manifests)
    sim_dra.publish_simulated(kube, {m["metadata"]["name"]: "a100-40gb:8" for m in manifests})
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    while not kube.get("ServiceAccount", "default", NS):
        time.sleep(0.2)
    kube.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "one-gpu", "namespace": NS},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}
            ]}}},
        }
    )  # fmt: skip

    def pod(i: int) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"p-{i}", "namespace": NS},
            "spec": {
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
                "containers": [
                    {"name": "c", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}
                ],
            },
        }

    started = time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda i: kube.create(pod(i)), range(claims)))
    created = time.monotonic() - started
    while True:
        placed = sum(1 for p in kube.list_objects("Pod", NS) if p["spec"].get("nodeName"))
        if placed >= claims:
            break
        time.sleep(0.2)
    took = time.monotonic() - started
    pairs = set()
    for c in kube.list_objects("ResourceClaim", NS):
        for r in c["status"]["allocation"]["devices"]["results"]:
            pairs.add((r["pool"], r["device"]))
    print(f"  pods created in {created:5.1f} s; all {claims} bound after {took:5.1f} s"
          f"  ({claims / took:5.1f} claims/s); distinct devices {len(pairs)}")  # fmt: skip


def prepare_latency(runs: int, time_slicing: bool = False, dynamic_mig: bool = False) -> None:
    """Prepare, prepare again and unprepare through the plugin's socket; with
    ``time_slicing`` each claim asks for interval Long, set (and put back) by the stub
    driver's nvidia-smi: a process per call, as on a real node; with ``dynamic_mig`` each claim
    is a 1g.10gb partition of an H100, created and destroyed in simulated NVML."""
    what = "TimeSlicing Long claims" if time_slicing else "whole-GPU claims"
    what = "DynamicMIG 1g.10gb claims" if dynamic_mig else what
    print(f"NodePrepareResources through the plugin socket ({runs} {what})")
    node = "bench-prepare"
    nvml = None
    if dynamic_mig:
        install_simulated_nvml("h100-80gb:8", seed=node)
        nvml = Nvml().open()
        inventory = nvml.inventory()
        refs = partitions.refs_by_name(inventory)
        devices = [n for n, r in refs.items() if r.partition and r.partition.profile == "1g.10gb"]
    else:
        inventory = sim_dra.simulated_inventory("a100-40gb:8", node)
        refs = dra_devices.refs_by_name(inventory)
        devices = [f"gpu-{i}" for i in range(8)]
    claims: dict[tuple[str, str], dict[str, Any]] = {}
    config = [{"source": "FromClaim", "opaque": {"driver": dra_devices.DRIVER, "parameters": {
        "apiVersion": GROUP_VERSION, "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
    }}}] if time_slicing else []  # fmt: skip

    def read(ns: str, name: str) -> dict[str, Any] | None:
        return claims.get((ns, name))

    with tempfile.TemporaryDirectory(prefix="dra-") as tmp:
        root = Path(tmp)
        paths = PluginPaths(root / "plugins" / dra_devices.DRIVER, root / "reg", root / "cdi")
        no_driver = HostDriver(None, DeviceNodes("/", {}, (), ()), "/", "/")
        gates = dragates.resolve({"TimeSlicingSettings": time_slicing, "DynamicMIG": dynamic_mig})
        settings = None
        if time_slicing:
            install_driver("a100-40gb:8", root / "stub-driver", seed=node)
            stub, missing = find_host_driver(str(root / "stub-driver"), "/")
            assert missing is None, missing
            settings = lambda: NvidiaSmi(stub)  # noqa: E731
        mig = MigControl(nvml) if nvml is not None else None
        plugin = DraPlugin(
            node, paths, lambda: refs, read, lambda: no_driver, gates, settings, mig=mig
        )
        with plugin:
            found = LocalDraKubelet(paths.registry_dir).wait_for_plugin(dra_devices.DRIVER)
            with DraClient(found.endpoint, found.version) as kubelet:
                fresh, again, unprep = [], [], []
                for i in range(runs):
                    uid = str(uuid.uuid4())
                    claims[("ns", f"c{i}")] = {
                        "metadata": {"namespace": "ns", "name": f"c{i}", "uid": uid},
                        "status": {"allocation": {"devices": {"results": [
                            {"request": "gpu", "driver": dra_devices.DRIVER,
                             "pool": node, "device": devices[i % len(devices)]}
                        ], "config": config}}},
                    }  # fmt: skip
                    key = ("ns", f"c{i}", uid)
                    t = time.perf_counter()
                    answer = kubelet.prepare(key)
                    fresh.append(time.perf_counter() - t)
                    assert not answer.claims[uid].error, answer.claims[uid].error
                    t = time.perf_counter()
                    kubelet.prepare(key)
                    again.append(time.perf_counter() - t)
                    t = time.perf_counter()
                    kubelet.unprepare(key)
                    unprep.append(time.perf_counter() - t)
    if nvml is not None:
        nvml.close()
        uninstall_simulated_nvml()
    row("prepare (read claim, write CDI spec, checkpoint)", summarize(fresh))
    row("prepare again (checkpointed)", summarize(again))
    row("unprepare", summarize(unprep))


NODE_GPUS = "h100-80gb:2"
WORKLOAD = testenv.binaries.node_image_name("shell")
MPS_CONFIG = {"apiVersion": GROUP_VERSION, "kind": "GpuConfig", "sharing": {
    "strategy": "MPS",
    "mpsConfig": {"defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "10Gi"},
}}  # fmt: skip
# What each kind of claim asks for, and the gates its plugin runs with (DynamicMIG and MPS
# cannot both be on).
NODE_CLAIMS: dict[str, tuple[dict[str, Any], dict[str, bool]]] = {
    "whole GPU": ({"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": "gpu.nvidia.com"}}]}, {}),
    "MPS, 50 % threads, 10Gi pinned": ({"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": "gpu.nvidia.com"}}], "config": [{"requests": ["gpu"], "opaque": {
            "driver": dra_devices.DRIVER, "parameters": MPS_CONFIG}}]}, {"MPSSupport": True}),
    "DynamicMIG 1g.10gb of an H100": ({"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": "mig.nvidia.com", "selectors": [{"cel": {"expression":
            f"device.attributes['{dra_devices.DRIVER}'].profile == '1g.10gb'"}}]}}]},
        {"DynamicMIG": True}),
}  # fmt: skip


def timed(call: Any, into: list[float]) -> Any:
    """``call``, appending the seconds of each successful return to ``into``."""

    def run(*args: Any) -> Any:
        started = time.perf_counter()
        result = call(*args)
        into.append(time.perf_counter() - started)
        return result

    return run


def on_a_real_node(cluster: testenv.Cluster, runs: int) -> None:
    """Prepare and Unprepare as a real node's kubelet calls them, for each of NODE_CLAIMS:
    ``runs`` pods one after another, each with a claim of its own; the plugin (in this process,
    over the stub driver's simulated NVML, as test_real_node_dynamic_mig.py runs it) times its
    side of each call; the pod's creation to Running and deletion to Unprepare are the
    kubelet's and containerd's share too. An MPS Prepare starts the claim's control daemon
    Deployment (the project's image, the stub driver's ``nvidia-cuda-mps-control``) and waits
    for it Ready on the node."""
    node = cluster.real_nodes[0]
    node_dir = cluster.real_node_dir(node)
    print(f"NodePrepareResources from a real kubelet on {node} ({NODE_GPUS}, {runs} pods each)")
    registration.register()  # the stub driver's NVML, as the plugin's command line has it
    with cluster.api_client() as client:
        kube = Kube(client)
        for obj in device_classes():
            kube.apply(obj)
        owner = dra_agent.node_owner(kube, node)
        with dra_node.namespace(kube, "bench-dra-node") as ns:
            for kind, (claim_spec, gates) in NODE_CLAIMS.items():
                root = node_dir / f"bench-{uuid.uuid4().hex[:6]}"
                install_driver(NODE_GPUS, root, seed=node)
                load_nvml(root)
                driver, missing = find_host_driver(str(root), str(root))  # seen alike
                assert missing is None, missing
                try:
                    with Nvml() as nvml, tempfile.TemporaryDirectory(dir="/tmp") as sockets:
                        where = (node, node_dir, Path(sockets))
                        samples = _node_runs(
                            kube, ns, where, nvml, driver, owner, claim_spec, gates, runs
                        )
                finally:
                    uninstall_simulated_nvml()
                    shutil.rmtree(root, ignore_errors=True)
                print(f"  {kind}")
                row("  plugin: prepare", summarize(samples["prepare"]))
                row("  plugin: unprepare", summarize(samples["unprepare"]))
                row("  pod created -> Running", summarize(samples["running"]))
                row("  pod deleted -> claim unprepared", summarize(samples["released"]))


def _node_runs(
    kube: Kube,
    ns: str,
    where: tuple[str, Path, Path],
    nvml: Nvml,
    driver: HostDriver,
    owner: dict[str, str] | None,
    claim_spec: dict[str, Any],
    asked: dict[str, bool],
    runs: int,
) -> dict[str, list[float]]:
    """``runs`` pods one after another on the node (``where``: its name, its directory and
    where the plugin's sockets go), each with a claim of ``claim_spec``; the seconds each took."""
    node, node_dir, sockets = where
    gates = dragates.resolve(asked)
    dynamic = gates.on("DynamicMIG")
    refs_of = partitions.refs_by_name if dynamic else dra_devices.refs_by_name
    paths = dra_node.plugin_paths(node_dir, sockets)
    mps = None
    if gates.on("MPSSupport"):
        pod = DaemonPod(node, ns, DEFAULT_OPERATOR_IMAGE, driver.host_root, pull_policy="Never")
        mps = MpsControl(kube, paths.plugin_dir, lambda: pod, lambda: NvidiaSmi(driver))
    plugin = DraPlugin(
        node,
        paths,
        lambda: refs_of(nvml.inventory()),
        lambda namespace, name: kube.get("ResourceClaim", name, namespace),
        lambda: driver,
        gates,
        lambda: NvidiaSmi(driver),
        mps=mps,
        mig=MigControl(nvml) if dynamic else None,
    )
    samples: dict[str, list[float]] = {
        k: [] for k in ("prepare", "unprepare", "running", "released")
    }
    plugin.prepare = timed(plugin.prepare, samples["prepare"])  # type: ignore[method-assign]
    plugin.unprepare = timed(plugin.unprepare, samples["unprepare"])  # type: ignore[method-assign]
    shape = dra_slices.dynamic_layout(kube.server_version()) if dynamic else None
    with dra_node.registered(plugin, node_dir), dra_node.slices_of(kube, node):
        inventory = nvml.inventory()
        dra_agent.publish(kube, node, inventory, owner, None, dra_agent.pool_of(inventory, shape))
        for i in range(runs):
            name = f"run-{i}"
            claim = {"metadata": {"name": name, "namespace": ns}, "spec": {"devices": claim_spec}}
            kube.create({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", **claim})
            started = time.monotonic()
            kube.create(_node_pod(name, ns, node))
            wait_for(f"{name} Running", dra_node.phase(kube, ns, name), 120)
            samples["running"].append(time.monotonic() - started)
            unprepared = len(samples["unprepare"])

            def released(before: int = unprepared) -> bool:
                return len(samples["unprepare"]) > before

            started = time.monotonic()
            kube.delete("Pod", name, ns, grace_period_seconds=0)
            wait_for(f"{name}'s claim unprepared", released, 120, every=0.05)
            samples["released"].append(time.monotonic() - started)
            kube.delete("ResourceClaim", name, ns)
    return samples


def _node_pod(name: str, ns: str, node: str) -> dict[str, Any]:
    container = {
        "name": "main",
        "image": WORKLOAD,
        "imagePullPolicy": "Never",
        "command": ["sleep", "3600"],
        "resources": {"claims": [{"name": "gpu"}]},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
            "containers": [container],
        },
    }


# The plugin's socket alone, a real node's kubelet, kwok nodes (publication and allocation).
PARTS = ("socket", "node", "kwok")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--claims", type=int, default=500)
    parser.add_argument("--prepares", type=int, default=300)
    parser.add_argument("--dynamic-mig-nodes", type=int, default=500)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--node-runs", type=int, default=30, help="pods per claim kind")
    parser.add_argument(
        "--parts",
        default=",".join(PARTS),
        help=f"which of {', '.join(PARTS)} to run (comma-separated; default: all)",
    )
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    unknown = parts - set(PARTS)
    if unknown:
        parser.error(f"--parts: unknown {', '.join(sorted(unknown))}; known: {', '.join(PARTS)}")
    logging.basicConfig(level=logging.WARNING)
    if "socket" in parts:
        prepare_latency(args.prepares, time_slicing=False)
        prepare_latency(args.prepares, time_slicing=True)
        prepare_latency(args.prepares, dynamic_mig=True)
    if "node" in parts:
        testenv.default_state_dir().mkdir(parents=True, exist_ok=True)
        with open(testenv.default_state_dir() / "bench-dra-images.log", "w") as log:
            image = testenv.binaries.ensure_project_images(log)[0]
        state = testenv.default_state_dir() / f"bench-dra-node-{uuid.uuid4().hex[:6]}"
        cluster = testenv.start(state, real_nodes=1)
        try:
            cluster.load_image(image)
            on_a_real_node(cluster, args.node_runs)
        finally:
            cluster.stop(remove_state=True)
    if "kwok" not in parts:
        return 0
    state = testenv.default_state_dir() / f"bench-dra-{uuid.uuid4().hex[:6]}"
    cluster = testenv.start(state)
    try:
        with cluster.api_client() as api:
            kube = Kube(api)
            for obj in device_classes():
                kube.apply(obj)
            publication(kube, args.nodes, args.workers)
            publication(kube, args.dynamic_mig_nodes, args.workers, dynamic_mig=True)
            for s in kube.list_objects("ResourceSlice"):
                kube.delete("ResourceSlice", s["metadata"]["name"])
            while kube.list_objects("ResourceSlice"):
                time.sleep(0.2)
            allocation(cluster, kube, args.claims)
    finally:
        cluster.stop(remove_state=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
