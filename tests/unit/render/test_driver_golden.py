"""Our driver rendering against NVIDIA's own golden renderings (five NVIDIADriver pairs).

Compared field by field on what matters to a node: images, command/args, env, volumes and
mounts, securityContext, probes, nodeSelector/affinity, tolerations and init containers, plus
the names and labels the objects carry. Deliberate differences (DIFFERENCES) are normalised
away, each with its reason; anything else that differs fails.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from gpu_operator.api.nvidiadriver import parse_driver_spec
from gpu_operator.render.driver import DriverNames, ExtraConfig, Pool, render_driver
from gpu_operator.render.facts import NodeOS
from tests.unit.api.test_nvidiadriver import GOLDEN, need
from tests.unit.rbac_grants import role_rules, verbs

DIFFERENCES = {
    "DRIVER_CONFIG_DIGEST": "a digest of our own inputs (same purpose: a config change rolls "
    "the pod), so its value differs",
    "startup probe ConfigMap": "named <ServiceAccount>-startup-probe, one per driver, not one "
    "nvidia-driver-startup-probe shared by every NVIDIADriver (each CR owns its objects, so "
    "deleting one cannot remove another's probe); the script is our own, same contract "
    "(.driver-ctr-ready in /run/nvidia/validations)",
    "labels": "ours add app.kubernetes.io/managed-by and part-of (the operator finds its "
    "objects by them); NVIDIA's labels are all present",
    "RBAC": "the driver manager's Role and ClusterRole grant only what the operator holds "
    "(Kubernetes refuses a Role wider than its author's): no `update` on nodes (patch "
    "cordons), no cluster-wide pods `watch` (it lists), DaemonSets `get` in a Role of the "
    "namespace instead of cluster-wide, and the SCC and ClusterVersion rules only on OpenShift; "
    "nothing is granted that NVIDIA's does not",
    "OpenShift Driver Toolkit": "not supported (03): the DTK side container, its env and "
    "the SCC/trusted-CA objects are not rendered; everything else of 03 is compared",
}

PAIRS = [
    "01-driver-minimal",
    "02-driver-precompiled",
    "03-driver-openshift-drivertoolkit",
    "04-driver-vgpu-host-manager",
    "05-driver-gds",
]


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def load_pair(name: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    data = yaml.safe_load(need(GOLDEN / f"{name}.input.yaml").read_text())
    base = yaml.safe_load((GOLDEN / "01-driver-minimal.input.yaml").read_text())["renderData"]
    render_data = _merge(base, data.get("overrides") or {}) if "base" in data else base
    golden = [d for d in yaml.safe_load_all((GOLDEN / f"{name}.golden.yaml").read_text()) if d]
    return render_data, golden


def ours(data: dict[str, Any]) -> list[dict[str, Any]]:
    driver = data["Driver"]
    spec = dict(driver["Spec"])
    spec["image"] = driver["ImagePath"]
    spec["manager"] = {"image": driver["ManagerImagePath"]}
    gds = data.get("GDS")
    if gds:
        spec["gds"] = {**gds["Spec"], "image": gds["ImagePath"]}
    os = NodeOS.parse(driver["OSVersion"])
    kernel = (data.get("Precompiled") or {}).get("KernelVersion")
    rhcos = (data.get("Openshift") or {}).get("RHCOSVersion")
    pool = Pool(os.id, os.version_id, kernel=kernel, rhcos_version=rhcos)
    extra = ExtraConfig(
        namespace=data["Runtime"]["Namespace"],
        openshift=bool(data.get("Openshift")),
        volumes=tuple((data.get("AdditionalConfigs") or {}).get("Volumes") or ()),
        mounts=tuple((data.get("AdditionalConfigs") or {}).get("VolumeMounts") or ()),
    )
    names = DriverNames(name=driver["Name"], app=driver["AppName"])
    return render_driver(parse_driver_spec(spec), pool, names, extra)


def _container(c: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in c.items() if k != "volumeMounts"}
    out["env"] = [
        {**e, "value": "<digest>"} if e["name"] == "DRIVER_CONFIG_DIGEST" else e
        for e in c.get("env") or []
    ]
    out["volumeMounts"] = sorted(
        c.get("volumeMounts") or [], key=lambda m: (m["name"], m["mountPath"])
    )
    return out


def _volume(v: dict[str, Any]) -> dict[str, Any]:
    if v["name"] == "driver-startup-probe-script":
        return {**v, "configMap": {**v["configMap"], "name": "<probe>"}}
    return v


def node_view(ds: dict[str, Any], *, dtk: bool = False) -> dict[str, Any]:
    """What a node gets from the DaemonSet."""
    pod = ds["spec"]["template"]["spec"]
    keep = ("affinity", "hostPID", "nodeSelector", "priorityClassName", "serviceAccountName",
            "tolerations", "imagePullSecrets", "terminationGracePeriodSeconds", "hostNetwork",
            "securityContext")  # fmt: skip
    view: dict[str, Any] = {k: pod.get(k) for k in keep}
    view["initContainers"] = [_container(c) for c in pod.get("initContainers") or []]
    if not dtk:
        view["containers"] = {c["name"]: _container(c) for c in pod["containers"]}
        view["volumes"] = sorted((_volume(v) for v in pod["volumes"]), key=lambda v: v["name"])
    view["updateStrategy"] = ds["spec"].get("updateStrategy")
    view["selector"] = ds["spec"]["selector"]
    view["name"] = ds["metadata"]["name"]
    return view


def _by_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


@pytest.mark.parametrize("name", PAIRS)
def test_daemonset_matches_nvidias_golden(name: str) -> None:
    data, golden = load_pair(name)
    rendered = ours(data)
    dtk = "Openshift" in data
    (theirs,) = _by_kind(golden, "DaemonSet")
    (mine,) = _by_kind(rendered, "DaemonSet")
    assert node_view(mine, dtk=dtk) == node_view(theirs, dtk=dtk)
    for where in (mine["metadata"], mine["spec"]["template"]["metadata"]):
        golden_where = (
            theirs["metadata"]
            if where is mine["metadata"]
            else theirs["spec"]["template"]["metadata"]
        )
        labels = {
            k: v
            for k, v in golden_where.get("labels", {}).items()
            if not k.startswith("openshift.")
        }
        assert labels.items() <= where["labels"].items()
        assert golden_where.get("annotations", {}).items() <= where.get("annotations", {}).items()


@pytest.mark.parametrize("name", PAIRS)
def test_rbac_objects_match_nvidias_golden(name: str) -> None:
    data, golden = load_pair(name)
    rendered = ours(data)
    for kind in ("ServiceAccount", "Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"):
        (theirs,) = _by_kind(golden, kind)
        (mine,) = _by_kind(rendered, kind)
        assert mine["metadata"]["name"] == theirs["metadata"]["name"], kind
        assert mine.get("metadata", {}).get("namespace") == theirs["metadata"].get("namespace")
        for field in ("roleRef", "subjects"):
            assert mine.get(field) == theirs.get(field), (kind, field)
    # DIFFERENCES["RBAC"]: a subset of NVIDIA's grants, short of exactly these.
    openshift = bool(data.get("Openshift"))
    mine_, theirs_ = verbs(role_rules(rendered)), verbs(role_rules(golden))
    assert mine_ <= theirs_
    assert theirs_ - mine_ == NOT_GRANTED | (set() if openshift else OPENSHIFT_GRANTS)


Verb = tuple[str, str, str]
NOT_GRANTED: set[Verb] = {("", "nodes", "update"), ("", "pods", "watch")}
OPENSHIFT_GRANTS: set[Verb] = {
    ("security.openshift.io", "securitycontextconstraints", "use"),
    ("config.openshift.io", "clusterversions", "get"),
    ("config.openshift.io", "clusterversions", "list"),
}


def test_probe_configmap_only_where_nvidia_has_one() -> None:
    for name in PAIRS:
        data, golden = load_pair(name)
        assert bool(_by_kind(ours(data), "ConfigMap")) == any(
            o["metadata"]["name"] == "nvidia-driver-startup-probe"
            for o in _by_kind(golden, "ConfigMap")
        ), name


def test_every_difference_has_a_reason() -> None:
    assert all(len(reason) > 40 for reason in DIFFERENCES.values())
