"""A GPUCluster's rendering, compared field by field with what NVIDIA's operator renders
(``../shared/reference/nvidia/golden-gpucluster/``).

Deliberate differences (also in the README):
- images and commands: every pod runs this project's image (``gpu-operator agent dra-plugin``,
  ``agent exporter``, ``agent validate``), as the ClusterPolicy stack's agents do; the plugin's
  container runs as root (the image's user is not) and reads NVIDIA's driver-ready file itself
  (``DRIVER_READY_FILE``) instead of a shell sourcing it;
- the kubelet plugin's ClusterRole is smaller: ComputeDomains only listed (with them on), no
  pod reads, nodes ``get`` (and ``patch`` with ComputeDomains, for the domain and clique
  labels); ResourceSlices ``patch`` instead of ``update`` (server-side apply);
- the MPS Role (NVIDIA's name) grants only what the plugin does with its daemons' Deployments
  (no update, patch or watch) and lists their pods; no driver-validation Role, no
  gRPC health probes on the ``gpus`` container (the ``compute-domains`` one has NVIDIA's);
- the ComputeDomain controller runs this project's loop (``gpu-operator
  compute-domain-controller``) with an HTTP liveness probe, patches where NVIDIA's updates,
  and keeps its Lease as the operator does (no LEADER_ELECTION_* variables); no
  ``computedomaincliques`` rules (daemons are listed in the domain's ``status.nodes``, NVIDIA's
  behaviour with the ComputeDomainCliques gate off); not NVIDIA's
  ResourceSlice node-restriction ValidatingAdmissionPolicy (a follow-up), but two of this
  project's that check GPU claim configs at admission, which NVIDIA's driver does in a webhook;
- the plugin's rolling update also says ``maxSurge: 0`` (two plugin pods on one node would fight
  over its registration socket); ``nvidia.com/gpu.deploy.*`` node selectors as NVIDIA's, but
  no nodeAffinity on NFD labels (the operator's labeller sets the deploy labels).
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from gpu_operator.api.gpucluster import example_document, parse_gpucluster
from gpu_operator.render.facts import Facts
from gpu_operator.render.gpucluster import render_gpucluster
from tests.prerequisites import nvidia
from tests.schema import validate_kubernetes
from tests.unit.rbac_grants import verbs

FACTS = Facts(namespace="test-operator")


def golden(name: str) -> dict[tuple[str, str], dict[str, Any]]:
    path = nvidia(f"golden-gpucluster/{name}")
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


@pytest.fixture(scope="module")
def ours() -> dict[tuple[str, str], dict[str, Any]]:
    doc = example_document()
    doc["spec"]["daemonsets"] = {
        "priorityClassName": "system-node-critical",
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    }
    objs = render_gpucluster(parse_gpucluster(doc), FACTS)
    return {(o["kind"], o["metadata"]["name"]): o for o in objs}


def pod(ds: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = ds["spec"]["template"]["spec"]
    return spec


def env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def same(ours_: dict[str, Any], theirs: dict[str, Any], *paths: str) -> None:
    for path in paths:
        a: Any = ours_
        b: Any = theirs
        for part in path.split("."):
            a = a.get(part) if isinstance(a, dict) else None
            b = b.get(part) if isinstance(b, dict) else None
        assert a == b, f"{path}: ours {a!r}, NVIDIA's {b!r}"


def test_every_object_is_valid_kubernetes_and_none_is_a_device_plugin(
    ours: dict[tuple[str, str], dict[str, Any]],
) -> None:
    for obj in ours.values():
        assert validate_kubernetes(obj), obj["kind"]
    assert not [k for k in ours if "device-plugin" in k[1]]


def test_device_classes_are_nvidias(ours: dict[tuple[str, str], dict[str, Any]]) -> None:
    theirs = golden("gpucluster-dra-driver-gpus-only.yaml")
    for name in ("gpu.nvidia.com", "mig.nvidia.com", "vfio.gpu.nvidia.com"):
        assert ours[("DeviceClass", name)]["spec"] == theirs[("DeviceClass", name)]["spec"]


def test_kubelet_plugin_daemonset_field_by_field(
    ours: dict[tuple[str, str], dict[str, Any]],
) -> None:
    theirs = golden("gpucluster-dra-driver-gpus-only.yaml")
    key = ("DaemonSet", "nvidia-dra-driver-kubelet-plugin")
    mine, nvidia = ours[key], theirs[key]
    same(mine, nvidia, "metadata.namespace", "spec.selector", "spec.updateStrategy.type")
    same(
        pod(mine),
        pod(nvidia),
        "nodeSelector",
        "priorityClassName",
        "serviceAccountName",
        "tolerations",
    )
    assert mine["spec"]["updateStrategy"]["rollingUpdate"] == {
        **nvidia["spec"]["updateStrategy"]["rollingUpdate"],
        "maxSurge": 0,
    }
    (c,) = pod(mine)["containers"]
    (n,) = pod(nvidia)["containers"]
    assert c["name"] == n["name"] == "gpus"
    # NVIDIA's image runs as root; the project's is nonroot, and the kubelet's plugin
    # directories are root's
    assert c["securityContext"] == {**n["securityContext"], "runAsUser": 0}
    for name in ("NODE_NAME", "NAMESPACE", "CDI_ROOT", "KUBELET_REGISTRAR_DIRECTORY_PATH",
                 "KUBELET_PLUGINS_DIRECTORY_PATH"):  # fmt: skip
        assert env(c)[name] == env(n)[name], name
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod(mine)["volumes"]}
    theirs_volumes = {v["name"]: v["hostPath"]["path"] for v in pod(nvidia)["volumes"]}
    for name in ("plugins-registry", "plugins", "cdi"):
        assert volumes[name] == theirs_volumes[name], name
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert {k: mounts[k] for k in ("plugins-registry", "plugins", "cdi")} == {
        m["name"]: m["mountPath"]
        for m in n["volumeMounts"]
        if m["name"] in ("plugins-registry", "plugins", "cdi")
    }


def test_plugin_rbac_is_least_privilege(ours: dict[tuple[str, str], dict[str, Any]]) -> None:
    theirs = golden("gpucluster-dra-driver-gpus-only.yaml")
    key = ("ClusterRole", "nvidia-dra-driver-kubeletplugin")
    mine = verbs(ours[key]["rules"])
    nvidia = verbs(theirs[key]["rules"])
    # server-side apply is a patch where NVIDIA's client updates
    assert mine - nvidia == {("resource.k8s.io", "resourceslices", "patch")}
    assert mine == {
        ("resource.k8s.io", "resourceclaims", "get"),
        *{("resource.k8s.io", "resourceslices", v)
          for v in ("get", "list", "watch", "create", "patch", "delete")},
        ("", "nodes", "get"),
    }  # fmt: skip
    binding = ours[("ClusterRoleBinding", "nvidia-dra-driver-kubeletplugin")]
    same(binding, theirs[("ClusterRoleBinding", "nvidia-dra-driver-kubeletplugin")],
         "roleRef", "subjects")  # fmt: skip


def test_validator_field_by_field(ours: dict[tuple[str, str], dict[str, Any]]) -> None:
    theirs = golden("gpucluster-dra-validation.yaml")
    key = ("ResourceClaimTemplate", "nvidia-dra-validator-gpu")
    assert ours[key]["spec"] == theirs[key]["spec"]
    ds = ("DaemonSet", "nvidia-dra-validator")
    same(ours[ds], theirs[ds], "metadata.namespace", "spec.updateStrategy")
    same(pod(ours[ds]), pod(theirs[ds]), "nodeSelector", "priorityClassName",
         "serviceAccountName", "tolerations", "resourceClaims")  # fmt: skip
    (init,) = pod(ours[ds])["initContainers"]
    (their_init,) = pod(theirs[ds])["initContainers"]
    assert init["name"] == their_init["name"]
    assert init["resources"] == their_init["resources"]


def test_exporter_field_by_field(ours: dict[tuple[str, str], dict[str, Any]]) -> None:
    theirs = golden("gpucluster-dcgm-exporter-embedded.yaml")
    key = ("ResourceClaimTemplate", "nvidia-dcgm-exporter-admin")
    assert ours[key]["spec"] == theirs[key]["spec"]
    ds = ("DaemonSet", "nvidia-dcgm-exporter-dra")
    same(pod(ours[ds]), pod(theirs[ds]), "nodeSelector", "priorityClassName",
         "serviceAccountName", "tolerations", "resourceClaims", "volumes")  # fmt: skip
    (c,) = pod(ours[ds])["containers"]
    (n,) = pod(theirs[ds])["containers"]
    assert c["name"] == n["name"] and c["ports"] == n["ports"]
    assert c["resources"]["claims"] == n["resources"]["claims"]
    assert c["volumeMounts"] == n["volumeMounts"]
    for name in ("DCGM_EXPORTER_LISTEN", "DCGM_EXPORTER_KUBERNETES", "NODE_NAME",
                 "KUBERNETES_ENABLE_DRA"):  # fmt: skip
        assert env(c)[name] == env(n)[name], name
    service = ("Service", "nvidia-dcgm-exporter-dra")
    assert ours[service]["spec"]["ports"][0]["port"] == theirs[service]["spec"]["ports"][0]["port"]


def test_feature_gates_and_env_reach_the_plugin() -> None:
    doc = example_document()
    doc["spec"]["draDriver"]["featureGates"] = {"MPSSupport": True, "DeviceMetadata": False}
    doc["spec"]["draDriver"]["gpus"] = {"kubeletPlugin": {"env": [{"name": "X", "value": "1"}]}}
    objs = render_gpucluster(parse_gpucluster(doc), FACTS)
    ds = next(o for o in objs if o["metadata"]["name"] == "nvidia-dra-driver-kubelet-plugin")
    (c,) = pod(ds)["containers"]
    assert env(c)["FEATURE_GATES"] == "DeviceMetadata=false,MPSSupport=true"
    assert env(c)["X"] == "1"


def test_passthrough_mounts_what_nvidias_plugin_mounts() -> None:
    """PassthroughSupport: the host's /lib/modules, /sys and /proc, as NVIDIA's operator mounts
    them (its golden with the gate on); without it, none of them."""

    def plugin_pod(gates: dict[str, bool]) -> dict[str, Any]:
        doc = example_document()
        doc["spec"]["draDriver"]["featureGates"] = gates
        objs = render_gpucluster(parse_gpucluster(doc), FACTS)
        ds = next(o for o in objs if o["metadata"]["name"] == "nvidia-dra-driver-kubelet-plugin")
        return pod(ds)

    theirs = pod(
        golden("gpucluster-dra-driver-passthrough-support.yaml")[
            ("DaemonSet", "nvidia-dra-driver-kubelet-plugin")
        ]
    )
    names = {"lib-modules", "sysfs", "procfs"}

    def mounts(p: dict[str, Any]) -> list[dict[str, Any]]:
        (c,) = [c for c in p["containers"] if c["name"] == "gpus"]
        return [m for m in c["volumeMounts"] if m["name"] in names]

    def volumes(p: dict[str, Any]) -> list[dict[str, Any]]:
        return [v for v in p["volumes"] if v["name"] in names]

    mine = plugin_pod({"PassthroughSupport": True})
    assert mounts(mine) == mounts(theirs) and len(mounts(mine)) == 3
    assert volumes(mine) == volumes(theirs)
    assert not mounts(plugin_pod({})) and not volumes(plugin_pod({}))


def test_claim_holders_are_recreated_when_the_driver_root_moves() -> None:
    """A prepared claim's CDI edits are fixed for its pod's life: pods prepared from the old
    driver root would keep mounting it. The claim holders' templates name the root; the
    plugin's (it mounts the root itself) changes anyway."""

    def templates(root: str | None) -> dict[str, Any]:
        doc = example_document()
        doc["spec"]["daemonsets"] = {"annotations": {"team": "gpu"}}
        if root:
            doc["spec"].setdefault("hostPaths", {})["driverInstallDir"] = root
        objs = render_gpucluster(parse_gpucluster(doc), FACTS)
        return {
            o["metadata"]["name"]: o["spec"]["template"] for o in objs if o["kind"] == "DaemonSet"
        }

    before, after = templates(None), templates("/home/kubernetes/bin/nvidia")
    for name in ("nvidia-dra-validator", "nvidia-dcgm-exporter-dra"):
        notes = before[name]["metadata"]["annotations"]
        assert notes == {"team": "gpu", "nvidia.com/gpu-operator.driver-root": "/run/nvidia/driver"}
        assert after[name] != before[name]
    assert after["nvidia-dra-driver-kubelet-plugin"] != before["nvidia-dra-driver-kubelet-plugin"]


def test_a_disabled_exporter_is_not_rendered() -> None:
    doc = example_document()
    doc["spec"]["dcgmExporter"] = {"enabled": False}
    names = {o["metadata"]["name"] for o in render_gpucluster(parse_gpucluster(doc), FACTS)}
    assert "nvidia-dcgm-exporter-dra" not in names
    assert "nvidia-dra-driver-kubelet-plugin" in names


def test_a_count_max_unavailable_is_an_integer() -> None:
    """NVIDIA's sample says maxUnavailable "1"; the API server refuses the string."""
    doc = example_document()
    doc["spec"]["daemonsets"] = {"rollingUpdate": {"maxUnavailable": "1"}}
    objs = render_gpucluster(parse_gpucluster(doc), FACTS)
    for ds in (o for o in objs if o["kind"] == "DaemonSet"):
        assert ds["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"] == 1


def test_the_mps_role_is_nvidias_less_what_the_plugin_never_does(
    ours: dict[tuple[str, str], dict[str, Any]],
) -> None:
    theirs = golden("gpucluster-dra-driver-gpus-only.yaml")
    key = ("Role", "nvidia-dra-driver-kubeletplugin-mps")
    mine, nvidia = verbs(ours[key]["rules"]), verbs(theirs[key]["rules"])
    # the daemons' pods are listed to say why one is not Ready when Prepare gives up on it
    assert mine - nvidia == {("", "pods", "list")}
    assert {v for g, r, v in mine if r == "deployments"} == {"get", "list", "create", "delete"}
    binding = ours[("RoleBinding", "nvidia-dra-driver-kubeletplugin-mps")]
    assert binding["roleRef"]["name"] == key[1]
    assert binding["subjects"] == theirs[("RoleBinding", key[1])]["subjects"]
    (plugin,) = pod(ours[("DaemonSet", "nvidia-dra-driver-kubelet-plugin")])["containers"]
    mounts = {m["name"]: m for m in plugin["volumeMounts"]}
    assert mounts["plugins"]["mountPropagation"] == "Bidirectional"  # the daemons' shm


@pytest.fixture(scope="module")
def with_domains() -> dict[tuple[str, str], dict[str, Any]]:
    doc = example_document()
    doc["spec"]["draDriver"]["computeDomains"] = {"enabled": True}
    objs = render_gpucluster(parse_gpucluster(doc), FACTS)
    return {(o["kind"], o["metadata"]["name"]): o for o in objs}


def test_compute_domains_bring_nvidias_objects_by_nvidias_names(
    with_domains: dict[tuple[str, str], dict[str, Any]],
    ours: dict[tuple[str, str], dict[str, Any]],
) -> None:
    theirs = golden("gpucluster-dra-driver-full-spec.yaml")
    wanted = {
        ("ServiceAccount", "nvidia-dra-driver-controller"),
        ("ClusterRole", "nvidia-dra-driver-controller"),
        ("ClusterRoleBinding", "nvidia-dra-driver-controller"),
        ("Role", "nvidia-dra-driver-controller"),
        ("RoleBinding", "nvidia-dra-driver-controller"),
        ("ServiceAccount", "compute-domain-daemon-service-account"),
        ("ClusterRole", "compute-domain-daemon"),
        ("ClusterRoleBinding", "compute-domain-daemon"),
        ("DeviceClass", "compute-domain-daemon.nvidia.com"),
        ("DeviceClass", "compute-domain-default-channel.nvidia.com"),
        ("Deployment", "nvidia-dra-driver-controller"),
    }
    assert wanted <= set(theirs)
    assert wanted <= set(with_domains)
    assert not wanted & set(ours)  # the example leaves them off
    for obj in with_domains.values():
        assert validate_kubernetes(obj), obj["kind"]
    for key in wanted:
        if key[0] == "DeviceClass":
            assert with_domains[key]["spec"] == theirs[key]["spec"], key
        if key[0] in ("ServiceAccount", "Role", "Deployment"):
            same(with_domains[key], theirs[key], "metadata.namespace")
    deployment = with_domains[("Deployment", "nvidia-dra-driver-controller")]
    (c,) = pod(deployment)["containers"]
    (n,) = pod(theirs[("Deployment", "nvidia-dra-driver-controller")])["containers"]
    assert c["name"] == n["name"] == "compute-domain"
    assert c["args"] == ["compute-domain-controller"]
    for name in ("NAMESPACE", "POD_NAME", "NVIDIA_VISIBLE_DEVICES"):
        assert env(c)[name] == env(n)[name], name
    assert pod(deployment)["serviceAccountName"] == "nvidia-dra-driver-controller"


def test_the_compute_domains_container_beside_the_gpus_one_is_nvidias(
    with_domains: dict[tuple[str, str], dict[str, Any]],
) -> None:
    theirs = golden("gpucluster-dra-driver-full-spec.yaml")
    key = ("DaemonSet", "nvidia-dra-driver-kubelet-plugin")
    mine = {c["name"]: c for c in pod(with_domains[key])["containers"]}
    nvidia = {c["name"]: c for c in pod(theirs[key])["containers"]}
    assert set(mine) == set(nvidia) == {"gpus", "compute-domains"}
    c, n = mine["compute-domains"], nvidia["compute-domains"]
    assert c["args"] == ["agent", "compute-domain-plugin"]
    for name in ("NODE_NAME", "NAMESPACE", "CDI_ROOT", "KUBELET_REGISTRAR_DIRECTORY_PATH",
                 "KUBELET_PLUGINS_DIRECTORY_PATH", "HEALTHCHECK_PORT",
                 "NVIDIA_VISIBLE_DEVICES"):  # fmt: skip
        assert env(c)[name] == env(n)[name], name
    for probe in ("startupProbe", "livenessProbe"):
        assert c[probe]["grpc"] == n[probe]["grpc"], probe
    assert {m["name"]: m["mountPath"] for m in c["volumeMounts"]} == {
        m["name"]: m["mountPath"] for m in n["volumeMounts"]
    }
    role = with_domains[("ClusterRole", "nvidia-dra-driver-kubeletplugin")]
    assert ("resource.nvidia.com", "computedomains", "list") in verbs(role["rules"])
