"""examples/nvidiadriver-pools.yaml does what its comments say."""

from __future__ import annotations

from typing import Any

import yaml

from gpu_operator.controller.nvidiadriver.decide import decide_drivers
from gpu_operator.controller.runtime.config import OperatorConfig
from gpu_operator.render.driver import POOL_LABEL
from tests.paths import REPO
from tests.unit.controller.nvidiadriver.fleet import applied, node, snapshot

EXAMPLE = REPO / "examples" / "nvidiadriver-pools.yaml"


def test_two_pools_from_the_example() -> None:
    docs = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    (cp,) = [d for d in docs if d["kind"] == "ClusterPolicy"]
    drivers = tuple(
        {**d, "metadata": {**d["metadata"], "uid": f"uid-{d['metadata']['name']}"}}
        for d in docs
        if d["kind"] == "NVIDIADriver"
    )
    nodes = [
        *(node(f"h100-{i}", "NVIDIA-H100-80GB-HBM3", "rhel", "9.4") for i in range(2)),
        *(node(f"t4-{i}", "Tesla-T4", "ubuntu", "24.04") for i in range(2)),
    ]
    snap = snapshot(nodes, drivers, cluster_policy=cp)
    snap = type(snap)(snap.base, snap.drivers, snap.managed, {"apt-mirror": ("mirror.list",)})
    decision = decide_drivers(snap, OperatorConfig())
    by_pool: dict[str, dict[str, Any]] = {
        ds["spec"]["template"]["spec"]["nodeSelector"][POOL_LABEL]: ds["spec"]["template"]["spec"]
        for ds in applied(decision, "DaemonSet")
    }
    assert sorted(by_pool) == ["h100", "t4"]
    h100 = {c["name"]: c for c in by_pool["h100"]["containers"]}
    assert h100["nvidia-driver-ctr"]["image"] == (
        "nvcr.io/nvidia/driver:580-5.14.0-427.13.1.el9_4.x86_64-rhel9.4"
    )
    assert "nvidia-peermem-ctr" in h100
    (t4,) = by_pool["t4"]["containers"]
    assert t4["image"] == "nvcr.io/nvidia/driver:535.261.03-ubuntu24.04"
    mounts = {m["mountPath"] for m in t4["volumeMounts"]}
    assert "/etc/apt/sources.list.d/mirror.list" in mounts
