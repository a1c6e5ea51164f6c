"""DRA timings against the real local control plane (testenv) and the plugin's own sockets.

    .venv/bin/python benchmarks/bench_dra.py [--nodes 1000] [--claims 500] [--prepares 300]

Prints: ResourceSlice publication for ``--nodes`` simulated nodes of 8 A100s each, and for
``--dynamic-mig-nodes`` nodes of 8 H100s publishing every partition with the DynamicMIG gate
(wall time, API requests and writes per node for the first pass and for an unchanged second
pass, slices and their bytes); how fast the real kube-scheduler allocates ``--claims``
single-GPU template claims on kwok nodes (pods/s from the first create to the last binding);
and NodePrepareResources latency through the plugin's unix socket (a fresh claim each time,
then the checkpointed answer), for whole GPUs, for TimeSlicing claims (whose interval the stub
driver's nvidia-smi sets) and for DynamicMIG partitions (a GPU and compute instance created
in simulated NVML at Prepare, destroyed at Unprepare). Figures only; nothing here gates CI.
"""

from __future__ import annotations

import argparse
import json
import logging
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
from gpu_operator.agent.dra.server import DraPlugin, PluginPaths
from gpu_operator.agent.dra.sharing import NvidiaSmi
from gpu_operator.agent.driver_cdi import HostDriver, find_host_driver
from gpu_operator.agent.driverroot import DeviceNodes
from gpu_operator.agent.inventory import Inventory
from gpu_operator.agent.nvml import Nvml
from gpu_operator.agent.simulated import install_simulated_nvml, uninstall_simulated_nvml
from gpu_operator.agent.simulated_operands import install_driver
from gpu_operator.api import dragates
from gpu_operator.api.draconfig import GROUP_VERSION
from gpu_operator.kube import Kube
from gpu_operator.render.dra import device_classes

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
        f"{prefix}-{i}": dra_agent.simulated_inventory(model, f"{prefix}-{i}") for i in range(nodes)
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
    dra_agent.publish_simulated(kube, {m["metadata"]["name"]: "a100-40gb:8" for m in manifests})
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
        inventory = dra_agent.simulated_inventory("a100-40gb:8", node)
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--claims", type=int, default=500)
    parser.add_argument("--prepares", type=int, default=300)
    parser.add_argument("--dynamic-mig-nodes", type=int, default=500)
    parser.add_argument("--workers", type=int, default=16)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    prepare_latency(args.prepares, time_slicing=False)
    prepare_latency(args.prepares, time_slicing=True)
    prepare_latency(args.prepares, dynamic_mig=True)
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
