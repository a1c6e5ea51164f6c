"""Pools, conflicts and handover: which NVIDIADriver drives which node (pure decisions)."""

from __future__ import annotations

from gpu_operator.controller.nvidiadriver.decide import decide_drivers
from gpu_operator.controller.pools import DriverSelector, assign
from gpu_operator.controller.runtime.actions import Create, Patch, Prune
from gpu_operator.controller.runtime.config import OperatorConfig
from gpu_operator.controller.runtime.plan import Observed
from gpu_operator.render.driver import POOL_LABEL
from gpu_operator.views import NodeView
from tests.unit.controller.nvidiadriver.fleet import (
    THREE_POOLS,
    applied,
    driver,
    node,
    policy,
    running,
    snapshot,
    twelve_nodes,
)

CONFIG = OperatorConfig(namespace="gpu-operator", identity="test")


def label_patches(decision: object) -> dict[str, str | None]:
    return {
        a.name: a.body["metadata"]["labels"][POOL_LABEL]
        for a in decision.actions  # type: ignore[attr-defined]
        if isinstance(a, Patch) and a.kind == "Node"
    }


def status_of(decision: object, name: str) -> dict[str, object]:
    (patch,) = [
        a
        for a in decision.actions  # type: ignore[attr-defined]
        if isinstance(a, Patch) and a.kind == "NVIDIADriver" and a.name == name
    ]
    return dict(patch.body["status"])


def events(decision: object) -> list[dict[str, object]]:
    return [dict(a.obj) for a in decision.actions if isinstance(a, Create)]  # type: ignore[attr-defined]


def test_three_pools_get_exactly_their_daemonsets() -> None:
    decision = decide_drivers(snapshot(twelve_nodes()), CONFIG)
    names = sorted(ds["metadata"]["name"] for ds in applied(decision, "DaemonSet"))
    assert [n.rsplit("-", 1)[0] for n in names] == [
        "nvidia-gpu-driver-rhel9.4",
        "nvidia-gpu-driver-ubuntu22.04",
        "nvidia-gpu-driver-ubuntu24.04",
    ]
    images = {
        ds["spec"]["template"]["spec"]["nodeSelector"][POOL_LABEL]: ds["spec"]["template"]["spec"][
            "containers"
        ][0]["image"]
        for ds in applied(decision, "DaemonSet")
    }
    assert images == {
        "a100": "nvcr.io/nvidia/driver:570.172.08-ubuntu22.04",
        "h100": "nvcr.io/nvidia/driver:570-5.14.0-427.13.1.el9_4.x86_64-rhel9.4",
        "t4": "nvcr.io/nvidia/driver:535.261.03-ubuntu24.04",
    }
    patches = label_patches(decision)
    assert len(patches) == 12 and {patches[f"h100-{i}"] for i in range(4)} == {"h100"}


def test_every_daemonset_is_owned_by_its_nvidiadriver() -> None:
    decision = decide_drivers(snapshot(twelve_nodes()), CONFIG)
    for ds in applied(decision, "DaemonSet"):
        (ref,) = ds["metadata"]["ownerReferences"]
        pool = ds["spec"]["template"]["spec"]["nodeSelector"][POOL_LABEL]
        assert (ref["kind"], ref["name"], ref["uid"]) == ("NVIDIADriver", pool, f"uid-{pool}")


def test_overlap_gives_the_node_neither_and_both_report_it() -> None:
    nodes = [*twelve_nodes(), node("mixed-0", "A100", "ubuntu", "22.04", canary="true")]
    drivers = (*THREE_POOLS, driver("canary", version="580.95.05", nodeSelector={"canary": "true"}))
    decision = decide_drivers(snapshot(nodes, drivers), CONFIG)
    assert label_patches(decision)["mixed-0"] == ""
    for name in ("a100", "canary"):
        status = status_of(decision, name)
        error = next(c for c in status["conditions"] if c["type"] == "Error")  # type: ignore[union-attr]
        assert error["status"] == "True" and "mixed-0" in error["message"]
        assert error["reason"] == "NodeSelectorConflict"
    warned = {e["involvedObject"]["name"] for e in events(decision)}  # type: ignore[index]
    assert {"a100", "canary"} <= warned
    # An overlap that comes later (a selector edited) leaves a node in its pool, its driver
    # running, while both report it.
    pooled = [*twelve_nodes(), node("mixed-0", "A100", "ubuntu", "22.04", canary="true",
                                    **{POOL_LABEL: "a100"})]  # fmt: skip
    later = decide_drivers(snapshot(pooled, drivers), CONFIG)
    assert "mixed-0" not in label_patches(later)
    error = next(c for c in status_of(later, "a100")["conditions"] if c["type"] == "Error")  # type: ignore[union-attr]
    assert error["reason"] == "NodeSelectorConflict" and "mixed-0" in error["message"]


def test_a_gpu_node_selected_by_none_is_reported() -> None:
    nodes = [*twelve_nodes(), node("l4-0", "L4", "ubuntu", "22.04")]
    decision = decide_drivers(snapshot(nodes), CONFIG)
    assert label_patches(decision)["l4-0"] == ""
    selection = next(
        c
        for c in status_of(decision, "t4")["conditions"]
        if c["type"] == "NodeSelection"  # type: ignore[union-attr]
    )
    assert selection["status"] == "True" and "l4-0" in selection["message"]


def test_default_driver_takes_the_nodes_nobody_selects() -> None:
    nodes = [*twelve_nodes(), node("l4-0", "L4", "ubuntu", "22.04")]
    drivers = (*THREE_POOLS, driver("default", version="580.95.05", default=True))
    decision = decide_drivers(snapshot(nodes, drivers), CONFIG)
    assert label_patches(decision)["l4-0"] == "default"
    assert label_patches(decision)["a100-0"] == "a100"


def test_flag_on_and_no_nvidiadriver_creates_default_from_the_clusterpolicy() -> None:
    cp = policy(version="570.172.08", repoConfig={"configMapName": "repos"}, rdma={"enabled": True})
    decision = decide_drivers(snapshot(twelve_nodes(), (), cluster_policy=cp), CONFIG)
    (create,) = decision.actions
    assert isinstance(create, Create)
    assert create.obj["metadata"]["name"] == "default"
    spec = create.obj["spec"]
    assert spec["default"] is True and spec["version"] == "570.172.08"
    assert spec["repoConfig"] == {"name": "repos"} and spec["rdma"] == {"enabled": True}


def test_flag_off_without_a_driver_of_its_own_releases_everything_at_once() -> None:
    cp = policy(useNvidiaDriverCRD=False, enabled=False)
    nodes = twelve_nodes(**{"a100-0": "a100", "a100-1": "a100"})
    managed = (Observed(("DaemonSet", "gpu-operator", "nvidia-gpu-driver-ubuntu22.04-x"), "h", 1),)
    decision = decide_drivers(snapshot(nodes, cluster_policy=cp, managed=managed), CONFIG)
    assert [a.key for a in decision.actions if isinstance(a, Prune)] == [managed[0].key]
    assert label_patches(decision) == {"a100-0": None, "a100-1": None}
    assert status_of(decision, "a100")["state"] == "ignored"


def test_flag_off_hands_nodes_back_to_the_clusterpolicy_driver_one_at_a_time() -> None:
    """Turning the flag off: the ClusterPolicy's driver takes the pools' nodes back as fast as
    its pods get Ready (maxParallelUpgrades at a time), and the pools' DaemonSets go last."""
    a100 = [f"a100-{i}" for i in range(4)]
    managed = (Observed(("DaemonSet", "gpu-operator", "nvidia-gpu-driver-ubuntu22.04-x"), "h", 1),)

    def decide(pools: dict[str, str], *, legacy: bool = True, ready: tuple[str, ...] = (),
               parallel: int = 1) -> object:  # fmt: skip
        ds = legacy_daemonset(handover=True)
        cp = policy(useNvidiaDriverCRD=False, upgradePolicy={"maxParallelUpgrades": parallel})
        snap = snapshot(deployable(twelve_nodes(**pools)), cluster_policy=cp, managed=managed,
                        daemonsets=[ds] if legacy else [],
                        pods=running(ds, list(ready), "r1") if legacy else [])  # fmt: skip
        return decide_drivers(snap, CONFIG)

    everywhere = {n: "a100" for n in a100} | {"t4-0": ""}
    # Its DaemonSet not there yet: only the node in no pool is released.
    first = decide(everywhere, legacy=False)
    assert label_patches(first) == {"t4-0": None}
    assert not [a for a in first.actions if isinstance(a, Prune)]  # type: ignore[attr-defined]
    ready = status_of(first, "a100")["conditions"]
    assert "4 still in a pool" in next(c for c in ready if c["type"] == "Ready")["message"]  # type: ignore[index,union-attr]
    # Then one node at a time, each once its new pod is Ready.
    assert label_patches(decide(everywhere)) == {"a100-0": None, "t4-0": None}
    rest = {n: "a100" for n in a100[1:]}
    assert label_patches(decide(rest)) == {}
    assert label_patches(decide(rest, ready=("a100-0",))) == {"a100-1": None}
    assert label_patches(decide(rest, parallel=2)) == {"a100-1": None}
    assert label_patches(decide({"a100-3": "a100"}, ready=("a100-0", "a100-1", "a100-2"))) == {
        "a100-3": None
    }
    # The pools' objects go once a pass sees no node left in one.
    assert not [a for a in decide({"a100-3": "a100"}, ready=tuple(a100[:3])).actions  # type: ignore[attr-defined]
                if isinstance(a, Prune)]  # fmt: skip
    last = decide({}, ready=tuple(a100))
    assert [a.key for a in last.actions if isinstance(a, Prune)] == [managed[0].key]  # type: ignore[attr-defined]


def test_clusterpolicy_driver_keeps_off_pooled_nodes_without_the_flag() -> None:
    from gpu_operator.controller.pools import handback_pending

    plain = legacy_daemonset()
    # Made while a node is still in a pool: it keeps off pooled nodes.
    assert handback_pending(twelve_nodes(**{"a100-0": "a100"}), [])
    assert not handback_pending(twelve_nodes(**{"a100-0": ""}), [])  # no pool's driver there
    assert not handback_pending(twelve_nodes(), [])
    # Once made, its template stays as it is, whichever way that was.
    assert handback_pending(twelve_nodes(), [legacy_daemonset(handover=True)])
    assert not handback_pending(twelve_nodes(**{"a100-0": "a100"}), [plain])


def test_an_invalid_clusterpolicy_moves_no_driver() -> None:
    """A ClusterPolicy its status reports invalid is not one without the flag: no node leaves
    its pool and no pool's driver is pruned until it is fixed."""
    cp = policy(upgradePolicy={"maxParallelUpgrades": -1})
    nodes = twelve_nodes(**{"a100-0": "a100"})
    managed = (Observed(("DaemonSet", "gpu-operator", "nvidia-gpu-driver-ubuntu22.04-x"), "h", 1),)
    decision = decide_drivers(snapshot(nodes, cluster_policy=cp, managed=managed), CONFIG)
    assert decision.actions == []


def test_invalid_driver_is_reported_and_renders_nothing() -> None:
    drivers = (driver("bad", driverType="cpu", nodeSelector={"x": "y"}),)
    decision = decide_drivers(snapshot(twelve_nodes(), drivers), CONFIG)
    assert not applied(decision, "DaemonSet")
    error = next(c for c in status_of(decision, "bad")["conditions"] if c["type"] == "Error")  # type: ignore[union-attr]
    assert "driverType" in error["message"]


def test_handover_moves_legacy_nodes_a_few_at_a_time() -> None:
    nodes = twelve_nodes()
    legacy = {n.name for n in nodes}
    selectors = [
        DriverSelector("a100", {"nvidia.com/gpu.product": "A100"}, handover=1),
        DriverSelector("h100", {"nvidia.com/gpu.product": "H100"}, handover=2),
        DriverSelector("t4", {"nvidia.com/gpu.product": "T4"}, handover=1),
    ]
    first = assign(nodes, selectors, legacy_driver_nodes=legacy)
    assert sorted(first.label_patches) == ["a100-0", "h100-0", "h100-1", "t4-0"]
    assert len(first.waiting) == 8
    # a100-0 handed over and Ready on its new driver: the next one goes.
    moved = twelve_nodes(**{"a100-0": "a100", "h100-0": "h100", "h100-1": "h100", "t4-0": "t4"})
    second = assign(moved, selectors, legacy_driver_nodes=legacy - {"a100-0"},
                    new_driver_ready={"a100-0"})  # fmt: skip
    assert sorted(second.label_patches) == ["a100-1"]


def test_nodes_without_a_legacy_driver_join_at_once() -> None:
    selectors = [DriverSelector("a100", {"nvidia.com/gpu.product": "A100"}, handover=1)]
    result = assign(twelve_nodes(), selectors)
    assert sorted(v for v in result.label_patches.values() if v) == ["a100"] * 4


def test_an_unchanged_cluster_writes_nothing_but_status_once() -> None:
    nodes = twelve_nodes(**{f"{g}-{i}": g for g in ("a100", "h100", "t4") for i in range(4)})
    decision = decide_drivers(snapshot(nodes), CONFIG)
    assert label_patches(decision) == {}


def test_clusterpolicy_keeps_its_driver_only_on_nodes_not_handed_over() -> None:
    from gpu_operator.api import parse_spec
    from gpu_operator.render import Facts, render

    spec = parse_spec({"driver": {"useNvidiaDriverCRD": True}})
    assert not [o for o in render(spec, Facts()) if o["kind"] == "DaemonSet"
                and o["metadata"]["name"].startswith("nvidia-driver")]  # fmt: skip
    (legacy,) = [
        o
        for o in render(spec, Facts(driver_handover=True))
        if o["kind"] == "DaemonSet" and o["metadata"]["name"].startswith("nvidia-driver")
    ]
    affinity = legacy["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    terms = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert {"key": POOL_LABEL, "operator": "DoesNotExist"} in terms[0]["matchExpressions"]
    # Without the flag it keeps off pooled nodes only while they are handed back.
    back = legacy_daemonset(handover=False)
    spec_off = parse_spec({"driver": {"useNvidiaDriverCRD": False}})
    (during,) = [o for o in render(spec_off, Facts(driver_handover=True))
                 if o["metadata"]["name"] == back["metadata"]["name"]]  # fmt: skip
    terms = during["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]  # fmt: skip
    assert {"key": POOL_LABEL, "operator": "DoesNotExist"} in terms[0]["matchExpressions"]
    assert "driver-pool" not in str(back["spec"]["template"]["spec"]["affinity"])


def legacy_daemonset(handover: bool = False) -> dict[str, object]:
    """The ClusterPolicy's own driver DaemonSet (ubuntu22.04) as the API server holds it:
    rendered before the flag (``handover`` False) or while nodes are handed over."""
    from gpu_operator.api import parse_spec
    from gpu_operator.render import Facts, render

    spec = parse_spec({"driver": {"useNvidiaDriverCRD": handover}})
    (ds,) = [
        o
        for o in render(spec, Facts(driver_handover=handover))
        if o["kind"] == "DaemonSet" and o["metadata"]["name"].startswith("nvidia-driver")
    ]
    owner = {"kind": "ClusterPolicy", "name": "cluster-policy", "uid": "cp", "controller": True}
    ds["metadata"] = {**ds["metadata"], "uid": "legacy", "ownerReferences": [owner]}
    return ds


def deployable(nodes: list[NodeView]) -> list[NodeView]:
    """``nodes`` with the label the operator puts on GPU nodes the driver is to run on."""
    return [NodeView(n.name, {**n.labels, "nvidia.com/gpu.deploy.driver": "true"}) for n in nodes]


def test_handover_is_pending_while_an_unpooled_node_runs_the_legacy_driver() -> None:
    from gpu_operator.controller.pools import handover_pending

    ds = legacy_daemonset(handover=True)
    a100 = {f"a100-{i}": "a100" for i in range(4)}  # the ubuntu22.04 nodes it selects
    pod = {"metadata": {"ownerReferences": [{"kind": "DaemonSet", "uid": "legacy"}]},
           "spec": {"nodeName": "a100-0"}}  # fmt: skip
    assert handover_pending(deployable(twelve_nodes()), [ds], [pod])
    assert not handover_pending(deployable(twelve_nodes(**a100)), [ds], [pod])
    # Its pods not seen yet (the pod watch trails): the nodes it selects still wait for it.
    assert handover_pending(deployable(twelve_nodes(**{"a100-0": "a100"})), [ds], [])
    # It selects no node and runs nowhere: nothing to hand over.
    assert not handover_pending(twelve_nodes(), [ds], [])


def test_legacy_driver_nodes_unseen_by_the_pod_watch_are_handed_over_one_at_a_time() -> None:
    """Right after the flag is set, the ClusterPolicy's driver DaemonSet is known but its pods
    are not (the pod watch trails it): its nodes still go over one at a time, and the
    ClusterPolicy keeps its driver for them."""
    from gpu_operator.controller.pools import legacy_driver_nodes

    nodes = deployable(twelve_nodes())
    drivers = (driver("default", version="570.172.08", default=True),)
    for ds in (legacy_daemonset(), legacy_daemonset(handover=True)):
        assert legacy_driver_nodes(nodes, [ds], []) == {f"a100-{i}" for i in range(4)}
        decision = decide_drivers(snapshot(nodes, drivers, daemonsets=[ds]), CONFIG)
        patched = label_patches(decision)
        assert [n for n in patched if n.startswith("a100")] == ["a100-0"]
        assert sorted(n for n in patched if not n.startswith("a100")) == sorted(
            n.name for n in nodes if not n.name.startswith("a100")
        )


def test_flag_off_right_after_the_pools_formed_waits_for_the_watches() -> None:
    """The flag turned off a moment after the nodes joined their pools: the node watch does
    not show the labels yet. The pools' driver is still on the nodes (its pods, its DaemonSet's
    count say so), so nothing is pruned, and the ClusterPolicy's driver keeps off pooled nodes."""
    from gpu_operator.controller.pools import handback_pending

    nodes = deployable(twelve_nodes())  # their pool labels not seen yet
    pool_ds = {
        "metadata": {"name": "nvidia-gpu-driver-ubuntu22.04-x", "namespace": "gpu-operator",
                     "uid": "pool", "labels": {"app.kubernetes.io/component": "nvidia-driver"},
                     "ownerReferences": [{"kind": "NVIDIADriver", "uid": "uid-a100"}]},
        "spec": {"template": {"metadata": {"labels": {}}}},
        "status": {"desiredNumberScheduled": 4, "currentNumberScheduled": 4},
    }  # fmt: skip
    assert handback_pending(nodes, [pool_ds])
    managed = (Observed(("DaemonSet", "gpu-operator", pool_ds["metadata"]["name"]), "h", 1),)
    cp = policy(useNvidiaDriverCRD=False)
    legacy = legacy_daemonset(handover=True)
    pods = running(pool_ds, [f"a100-{i}" for i in range(4)], "p1")
    for seen in (pods, []):  # its pods seen, or only its DaemonSet's count
        snap = snapshot(nodes, cluster_policy=cp, managed=managed,
                        daemonsets=[legacy, pool_ds], pods=seen)  # fmt: skip
        decision = decide_drivers(snap, CONFIG)
        assert not [a for a in decision.actions if isinstance(a, Prune)]
    gone = {**pool_ds, "status": {"desiredNumberScheduled": 0, "currentNumberScheduled": 0}}
    snap = snapshot(nodes, cluster_policy=cp, managed=managed, daemonsets=[legacy, gone])
    assert [a.key for a in decide_drivers(snap, CONFIG).actions if isinstance(a, Prune)] == [
        managed[0].key
    ]


def test_nodes_moving_between_pools_go_a_few_at_a_time() -> None:
    """A new NVIDIADriver taking nodes from ``default`` (its selector, or an edited one): each
    node runs default's driver until it moves, so they move like a handover, the next once the
    last has its new pool's driver Ready, and not on the strength of the old pool's pod."""
    from gpu_operator.controller.pools import pool_driver_ready, pools_with_driver

    everything = {n.name: "default" for n in twelve_nodes()}
    selectors = [
        DriverSelector("default", default=True),
        DriverSelector("a100", {"nvidia.com/gpu.product": "A100"}, handover=1),
    ]
    # default's DaemonSet is there (its pods maybe not seen yet): its nodes wait their turn.
    first = assign(twelve_nodes(**everything), selectors, pools_with_driver={"default"})
    assert first.label_patches == {"a100-0": "a100"}
    assert sorted(first.waiting) == ["a100-1", "a100-2", "a100-3"]
    # Nodes of a pool with no driver (its NVIDIADriver deleted) gain nothing by waiting.
    orphans = assign(twelve_nodes(**everything), selectors)
    assert sorted(orphans.label_patches) == [f"a100-{i}" for i in range(4)]

    moved = twelve_nodes(**{**everything, "a100-0": "a100"})

    def owned(pool: str) -> dict[str, object]:
        return {"metadata": {"name": f"nvidia-gpu-driver-{pool}", "namespace": "gpu-operator",
                             "uid": f"ds-{pool}",
                             "labels": {"app.kubernetes.io/component": "nvidia-driver"},
                             "ownerReferences": [{"kind": "NVIDIADriver", "name": pool}]},
                "spec": {"template": {"metadata": {"labels": {}}}}}  # fmt: skip

    sets = [owned("default"), owned("a100")]
    old_pod = running(sets[0], ["a100-0"], "r1")  # default's pod, not gone yet
    assert pool_driver_ready(moved, sets, old_pod) == set()
    assert pools_with_driver(sets) == {"default", "a100"}
    others = set(everything) - {"a100-0"}  # default's driver Ready on the rest
    pooled = pools_with_driver(sets)
    assert (
        assign(moved, selectors, new_driver_ready=others, pools_with_driver=pooled).label_patches
        == {}
    )
    ready = pool_driver_ready(moved, sets, running(sets[1], ["a100-0"], "r1"))
    assert ready == {"a100-0"}
    after = assign(moved, selectors, new_driver_ready=ready | others, pools_with_driver=pooled)
    assert after.label_patches == {"a100-1": "a100"}
