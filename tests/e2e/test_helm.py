"""The Helm chart with NVIDIA's values, on the real local control plane.

`helm lint` and `helm template` (every object valid for Kubernetes 1.34, the ClusterPolicy for
our CRD) need no cluster. Then, on clusters of kwok GPU nodes: `helm install` with NVIDIA's
default values and with a real-world values file reaches `ready`; `helm upgrade --set
driver.version=...` rolls the new driver across the nodes; the pre-install/pre-upgrade hook
puts a newer CRD in place before the ClusterPolicy is applied; `helm uninstall` leaves the nodes
as they were and no object of the release behind: no resource of the operator's kinds, no
DaemonSet (an NVIDIADriver's too), and with operator.cleanupCRD none of the three CRDs.

What runs and what is played: the images cannot run on kwok nodes, so

* the operator runs in this process (as other e2e tests run it) from the chart's Deployment as
  Helm created it: the token of the Deployment's ServiceAccount (so the chart's RBAC), its
  container args parsed by the real CLI parser (`run`, `--no-install-crd`), its namespace and
  its `*_IMAGE` env; kwok makes the Deployment's pods Ready, which is what `helm --wait` waits
  for. The image itself, probes, resources and security context are not exercised here.
* the hook pods are scheduled and marked Running by kwok; `HookKubelet` then does what their
  kubelet would: it runs the pod's container (the `gpu-operator` CLI with the pod's args, as the
  pod's ServiceAccount, through a token) and reports its exit as the pod's phase, which is what
  Helm waits for.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from gpu_operator import __version__, testenv
from gpu_operator.api import parse_document
from gpu_operator.api.crd import clusterpolicy_crd
from gpu_operator.cli import build_parser
from gpu_operator.controller.runner import IMAGE_ENV_NAMES, OperatorThread, RunOptions
from gpu_operator.controller.runtime.config import OperatorConfig
from gpu_operator.controller.runtime.crd_install import SCHEMA_ANNOTATION, VERSION_ANNOTATION
from gpu_operator.install import helm
from gpu_operator.install.helm_values import MOVES, handled
from gpu_operator.install.uninstall_plan import CRDS, RESOURCE_KINDS
from gpu_operator.kube import Kube
from gpu_operator.labels import DRIVER_POOL
from gpu_operator.testenv import releases
from gpu_operator.testenv.releases import OLDEST
from tests.e2e.helm_support import CHART, NS, RELEASE, Helm
from tests.e2e.support import (
    NotYet,
    policy_api_served,
    policy_ready,
    policy_status,
    private_cluster,
    service_account_config,
    token_kubeconfig,
    wait_for,
)
from tests.paths import REPO
from tests.schema import strict, validate_kubernetes
from tests.unit.install.values_data import REAL_WORLD, keys_file, nvidia_values

STATE = "nvidia.com/gpu-driver-upgrade-state"
HOOKS = f"app.kubernetes.io/name=gpu-operator,{helm.HOOK_LABEL} in (crd-upgrade,uninstall)"


@pytest.fixture
def nvidia_values_file(tmp_path: Path) -> Path:
    """NVIDIA's chart v26.3.1 default values, as a values file."""
    path = tmp_path / "nvidia-values.yaml"
    path.write_text(yaml.safe_dump(nvidia_values()))
    return path


def policy_of(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (policy,) = [o for o in objects if o["kind"] == "ClusterPolicy"]
    return policy


VALUES_SETS = {
    "chart-defaults": (),
    "nvidia-defaults": ("-f", "{nvidia}"),
    "real-world": ("-f", str(REAL_WORLD)),
    "no-crd-hooks": ("--set", "operator.upgradeCRD=false", "--set", "operator.cleanupCRD=false"),
}


@pytest.mark.one_release  # helm alone: the same on every release
@pytest.mark.parametrize("name", sorted(VALUES_SETS))
def test_lint_and_template_give_valid_objects(
    testenv_bin_dir: Path, tmp_path: Path, nvidia_values_file: Path, name: str
) -> None:
    args = [a.format(nvidia=nvidia_values_file) for a in VALUES_SETS[name]]
    helm_ = Helm(testenv_bin_dir, tmp_path)
    lint = helm_.run("lint", "--strict", str(CHART), *args)
    assert "0 chart(s) failed" in lint.stdout
    objects = helm_.template(*args, "--kube-version", OLDEST)  # the oldest claimed is taken
    older = f"1.{releases.minor(OLDEST) - 1}.0"
    refused = helm_.run("template", RELEASE, str(CHART), *args, "--kube-version", older, ok=False)
    assert refused.returncode != 0 and "kubeVersion" in refused.stderr, refused.stderr
    crd_schema = strict(clusterpolicy_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    kinds = []
    for obj in objects:
        kinds.append(obj["kind"])
        if obj["kind"] == "ClusterPolicy":
            parse_document(obj)
            jsonschema.validate(obj, crd_schema)
        else:
            assert validate_kubernetes(obj), f"no schema for {obj['kind']}"
    assert kinds.count("ClusterPolicy") == 1 and kinds.count("Deployment") == 1
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    env = {
        e["name"]: e.get("value")
        for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    # NVIDIA's default, operator.logging.develMode: false, is its JSON (production) logging.
    assert env.get("LOG_FORMAT") == ("json" if name == "nvidia-defaults" else None)
    hooks = {o["metadata"]["name"] for o in objects if o["kind"] == "Pod"}
    upgrade_crd = name != "no-crd-hooks"
    assert hooks == {helm.UNINSTALL_HOOK, *([helm.CRD_HOOK] if upgrade_crd else [])}


def _flat(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict) and value:
        for key, child in value.items():
            yield from _flat(child, f"{prefix}.{key}" if prefix else key)
    else:
        yield prefix, value


def _get(obj: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(obj, dict) or part not in obj:
            return None
        obj = obj[part]
    return obj


@pytest.mark.one_release  # helm alone: the same on every release
def test_every_nvidia_value_lands_where_its_key_says(
    testenv_bin_dir: Path, tmp_path: Path, nvidia_values_file: Path
) -> None:
    """Each of NVIDIA's default values that goes to the ClusterPolicy is there, at its place and
    as a string where the CRD wants one; "not set" values are left to the operator; nothing
    else reaches the policy."""
    spec = policy_of(Helm(testenv_bin_dir, tmp_path).template("-f", str(nvidia_values_file)))[
        "spec"
    ]
    expected = {}
    for key, value in keys_file().items():
        if handled(key) not in ("ClusterPolicy", "accepted, not implemented"):
            continue
        for source, target in MOVES:
            if key == source or key.startswith(source + "."):
                key = target + key[len(source) :]
        for path, leaf in _flat(value, key):
            if leaf not in ("", [], {}, None):
                expected[path] = str(leaf) if path.endswith(".version") else leaf
    got = dict(_flat(spec))
    assert got == expected


@pytest.mark.one_release  # helm alone: the same on every release
def test_unknown_keys_fail_by_name_and_values_stay_data(
    testenv_bin_dir: Path, tmp_path: Path
) -> None:
    helm_ = Helm(testenv_bin_dir, tmp_path)
    failed = helm_.run("template", RELEASE, str(CHART), "--set", "driver.verison=1", ok=False)
    assert failed.returncode != 0
    assert "at '/driver': additional properties 'verison' not allowed" in failed.stderr
    failed = helm_.run(
        "template", RELEASE, str(CHART), "--set", "devicePlugin.config.create=true", ok=False
    )
    assert "devicePlugin.config.name: name the ConfigMap" in failed.stderr
    hostile = 'x"\nkind: Secret\nmetadata: {name: pwned}\nspec:\n  a: "'
    objects = helm_.template(
        "--set-string",
        f"driver.version={hostile}",
        "--set-string",
        f"operator.version={hostile}",
        "--set-string",
        f"daemonsets.labels.team={hostile}",
    )
    assert "Secret" not in {o["kind"] for o in objects}
    spec = policy_of(objects)["spec"]
    assert spec["driver"]["version"] == hostile and spec["daemonsets"]["labels"]["team"] == hostile
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image.startswith("ghcr.io/gpu-operator/gpu-operator") and image.endswith(hostile)


@dataclass
class HookRun:
    pod: str
    args: list[str]
    returncode: int
    output: str


@dataclass
class HookKubelet:
    """Runs each hook pod kwok has started, as its kubelet would run its container."""

    cluster: testenv.Cluster
    workdir: Path
    runs: list[HookRun] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _seen: set[str] = field(default_factory=set)
    error: BaseException | None = None

    def _loop(self) -> None:
        try:
            with self.cluster.api_client() as api:
                kube = Kube(api)
                while not self._stop.wait(0.3):
                    for pod in kube.list_objects("Pod", NS, label_selector=HOOKS):
                        status = pod.get("status") or {}
                        uid = pod["metadata"]["uid"]
                        if uid in self._seen or status.get("phase") != "Running":
                            continue  # kwok has not started it yet, or it already ran
                        self._seen.add(uid)
                        self._run(kube, pod)
        except BaseException as exc:
            self.error = exc

    def _run(self, kube: Kube, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        spec = pod["spec"]
        (container,) = spec["containers"]
        config = service_account_config(self.cluster, NS, spec["serviceAccountName"], "")
        kubeconfig = token_kubeconfig(self.cluster, config, self.workdir / f"{name}.kubeconfig")
        env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
        env.update({e["name"]: e["value"] for e in container.get("env", []) if "value" in e})
        env["KUBECONFIG"] = str(kubeconfig)
        done = subprocess.run(
            [sys.executable, "-m", "gpu_operator", *container["args"]],
            capture_output=True, text=True, env=env, cwd=REPO, timeout=600,
        )  # fmt: skip
        self.runs.append(
            HookRun(name, container["args"], done.returncode, done.stdout + done.stderr)
        )
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        state = {
            "exitCode": done.returncode,
            "reason": "Completed" if done.returncode == 0 else "Error",
            "startedAt": now,
            "finishedAt": now,
        }
        status = {
            "phase": "Succeeded" if done.returncode == 0 else "Failed",
            "containerStatuses": [
                {
                    "name": container["name"],
                    "image": container["image"],
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "state": {"terminated": state},
                }
            ],
        }
        kube.merge_patch("Pod", name, {"status": status}, NS, subresource="status")

    @contextmanager
    def running(self) -> Iterator[HookKubelet]:
        thread = threading.Thread(target=self._loop, name="hook-kubelet", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            thread.join(10)
        assert self.error is None, self.error

    def ran(self, pod: str) -> HookRun:
        runs = [r for r in self.runs if r.pod == pod]
        assert runs, f"hook {pod} did not run; ran: {[r.pod for r in self.runs]}"
        assert runs[-1].returncode == 0, runs[-1].output
        return runs[-1]


def operator_from_deployment(cluster: testenv.Cluster, kube: Kube) -> OperatorThread:
    """The operator as the chart's Deployment would run it, in this process."""
    deployment = kube.request("GET", f"/apis/apps/v1/namespaces/{NS}/deployments/gpu-operator")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = build_parser().parse_args(container["args"])
    assert args.func.__name__ == "_cmd_run"
    env = {e["name"]: e for e in container["env"]}
    assert env["OPERATOR_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    settings = OperatorConfig(
        namespace=deployment["metadata"]["namespace"],
        operator_image=env["OPERATOR_IMAGE"]["value"],
        image_env={k: env[k]["value"] for k in IMAGE_ENV_NAMES if k in env},
    )
    options = RunOptions(
        config=settings,
        apply_crd=args.install_crd,
        leader_election=args.leader_election,
        health_endpoint=None,
        metrics_port=None,
        renew_seconds=2.0,
        lease_seconds=6,
    )
    config = service_account_config(cluster, NS, pod["serviceAccountName"], "")
    return OperatorThread(options, config).start()


def node_state(kube: Kube) -> dict[str, Any]:
    """Every node's labels, taints and nvidia.com annotations, to compare before and after.

    The node lifecycle controller's own taints (``node.kubernetes.io/not-ready`` while a fresh
    node comes up) are left out: they follow readiness, not anything Helm or the operator did.
    """
    return {
        n["metadata"]["name"]: {
            "labels": n["metadata"].get("labels") or {},
            "taints": [
                t
                for t in n["spec"].get("taints") or []
                if not t.get("key", "").startswith("node.kubernetes.io/")
            ],
            "annotations": {
                k: v for k, v in (n["metadata"].get("annotations") or {}).items() if "nvidia" in k
            },
        }
        for n in kube.list_objects("Node")
    }


def assert_nodes_as_before(kube: Kube, before: dict[str, Any]) -> None:
    after = node_state(kube)
    for name, was in before.items():
        assert after[name]["labels"] == was["labels"], name
        assert after[name]["taints"] == was["taints"], name
    left = {
        name: sorted(set(after[name]["annotations"]) - set(was["annotations"]))
        for name, was in before.items()
    }
    assert not any(left.values()), left


NAMESPACED = ("Pod", "DaemonSet", "ConfigMap", "Service", "ServiceAccount", "Role", "RoleBinding",
              "Lease", "PodDisruptionBudget", "ControllerRevision")  # fmt: skip
CLUSTER_WIDE = ("ClusterRole", "ClusterRoleBinding", "RuntimeClass")


def leftovers(kube: Kube) -> list[str]:
    """Objects of the release or the operator still there (Events aside; they expire)."""
    found = []
    for kind in NAMESPACED:
        for obj in kube.list_objects(kind, NS):
            name = obj["metadata"]["name"]
            if (kind, name) not in {
                ("ServiceAccount", "default"),
                ("ConfigMap", "kube-root-ca.crt"),
            }:
                found.append(f"{kind} {name}")
    deployments = kube.request("GET", f"/apis/apps/v1/namespaces/{NS}/deployments")["items"]
    found += [f"Deployment {d['metadata']['name']}" for d in deployments]
    for kind in CLUSTER_WIDE:
        for obj in kube.list_objects(kind):
            name = obj["metadata"]["name"]
            if name.startswith(("gpu-operator", "nvidia")):
                found.append(f"{kind} {name}")
    return found


def wait_nothing_left(kube: Kube) -> None:
    wait_for(
        "nothing of the release left",
        lambda: not (left := leftovers(kube)) or NotYet({"left behind": left}),
        timeout=60,
    )


def ready(kube: Kube) -> dict[str, Any] | NotYet:
    return policy_ready(kube, helm.POLICY_NAME)


def test_nvidia_defaults_install_upgrade_driver_and_uninstall(
    testenv_bin_dir: Path, tmp_path: Path, nvidia_values_file: Path
) -> None:
    with (
        private_cluster(testenv_bin_dir, gpu_nodes=2, cpu_nodes=1) as cluster,
        cluster.api_client() as api,
        HookKubelet(cluster, tmp_path).running() as hooks,
    ):
        kube = Kube(api)
        helm_ = Helm(testenv_bin_dir, tmp_path, cluster.kubeconfig)
        before = node_state(kube)
        install = helm_.install("-f", str(nvidia_values_file))
        assert hooks.ran(helm.CRD_HOOK).args == ["crd", "--apply"]
        # NVIDIA's keys that mean nothing here are named, and NVIDIA's operator image replaced.
        assert "Accepted but ignored" in install.stdout and "nfd.enabled" in install.stdout
        assert "ghcr.io/gpu-operator/gpu-operator:v0.1.0" in install.stdout
        operator = operator_from_deployment(cluster, kube)
        try:
            wait_for("the policy ready", lambda: ready(kube), timeout=90)
            gpu_nodes = [n for n in kube.list_objects("Node") if "gpu" in n["metadata"]["name"]]

            # The CRD in the cluster is older than the chart (as after upgrading the chart): the
            # pre-upgrade hook applies the chart's before the release's objects change.
            kube.apply(old_crd("gpuNodeTaint"))
            assert crd_fields(kube)[0] == "0.0.1" and "gpuNodeTaint" not in crd_fields(kube)[1]
            helm_.run(
                "upgrade", RELEASE, str(CHART), "-n", NS, "--reuse-values",
                "--set", "driver.version=580.105.08", "--wait", "--timeout", "3m",
            )  # fmt: skip
            assert len([r for r in hooks.runs if r.pod == helm.CRD_HOOK]) == 2
            version, fields = crd_fields(kube)
            assert version == __version__ and "gpuNodeTaint" in fields
            policy = kube.get("ClusterPolicy", helm.POLICY_NAME) or {}
            assert policy["spec"]["driver"]["version"] == "580.105.08"
            seen: set[str] = set()

            def rolled() -> bool | NotYet:
                states = [
                    (kube.get("Node", n["metadata"]["name"]) or {})["metadata"]["labels"].get(STATE)
                    for n in gpu_nodes
                ]
                seen.update(s for s in states if s)
                if len(seen) > 1 and all(s == "upgrade-done" for s in states):
                    return True
                return NotYet({"states": states, "seen": sorted(seen)})

            wait_for("the new driver rolled across the nodes", rolled, timeout=180)
            assert seen - {"upgrade-done"}, "the upgrade state never moved"
            drivers = [
                d for d in kube.list_objects("DaemonSet", NS) if "driver" in d["metadata"]["name"]
            ]
            assert drivers and all(
                "580.105.08" in d["spec"]["template"]["spec"]["containers"][0]["image"]
                for d in drivers
            )

            helm_.uninstall()
            uninstall = hooks.ran(helm.UNINSTALL_HOOK)
            assert "uninstalled: no ClusterPolicy, NVIDIADriver or GPUCluster" in uninstall.output
        finally:
            operator.stop()
        wait_nothing_left(kube)
        # NVIDIA's values say operator.cleanupCRD: false, as NVIDIA's chart keeps its CRDs.
        assert all(kube.get("CustomResourceDefinition", name) is not None for name in CRDS)
        assert not [obj for kind in RESOURCE_KINDS for obj in kube.list_objects(kind)]
        assert_nodes_as_before(kube, before)


def old_crd(*path: str) -> dict[str, Any]:
    """The CRD of an older release, which lacks the field at ``path`` (under spec)."""
    crd = clusterpolicy_crd()
    crd["metadata"]["annotations"] = {VERSION_ANNOTATION: "0.0.1", SCHEMA_ANNOTATION: "old"}
    node = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    for part in path[:-1]:
        node = node["properties"][part]
    del node["properties"][path[-1]]
    return crd


def crd_fields(kube: Kube) -> tuple[str, set[str]]:
    """The version the CRD in the cluster says it is, and its spec fields."""
    crd = kube.get("CustomResourceDefinition", "clusterpolicies.nvidia.com") or {}
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return crd["metadata"]["annotations"][VERSION_ANNOTATION], set(schema["properties"])


@pytest.mark.one_release  # the install on the oldest release: the NVIDIA-defaults test
def test_real_world_values_new_crd_first_and_nothing_left(
    testenv_bin_dir: Path, tmp_path: Path
) -> None:
    with (
        private_cluster(testenv_bin_dir, gpu_nodes=1, cpu_nodes=1) as cluster,
        cluster.api_client() as api,
        HookKubelet(cluster, tmp_path).running() as hooks,
    ):
        kube = Kube(api)
        helm_ = Helm(testenv_bin_dir, tmp_path, cluster.kubeconfig)
        before = node_state(kube)
        # An older release's CRD is there: Helm skips crds/ for a CRD that exists.
        kube.apply(old_crd("devicePlugin", "config"))
        wait_for("the old CRD served", lambda: policy_api_served(kube))
        helm_.install("-f", str(REAL_WORLD))
        assert "applied the ClusterPolicy CRD" in hooks.ran(helm.CRD_HOOK).output
        crd = kube.get("CustomResourceDefinition", "clusterpolicies.nvidia.com") or {}
        assert crd["metadata"]["annotations"][VERSION_ANNOTATION] == __version__
        # ... so the ClusterPolicy kept what the values said instead of losing it to pruning.
        policy = kube.get("ClusterPolicy", helm.POLICY_NAME) or {}
        assert policy["spec"]["devicePlugin"]["config"] == {
            "name": "time-slicing-config",
            "default": "any",
        }
        assert kube.get("ConfigMap", "time-slicing-config", NS) is not None
        operator = operator_from_deployment(cluster, kube)
        try:
            wait_for("the policy ready", lambda: ready(kube), timeout=90)
            plugin = kube.get("DaemonSet", "nvidia-device-plugin-daemonset", NS) or {}
            assert "time-slicing-config" in json.dumps(plugin["spec"]["template"]["spec"])

            # A field NVIDIA moved is kept by the CRD and refused in the status, with its place.
            kube.merge_patch(
                "ClusterPolicy",
                helm.POLICY_NAME,
                {"spec": {"driver": {"use_ocp_driver_toolkit": True}}},
            )
            wait_for(
                "the status to name the field's new place",
                lambda: (
                    "moved to spec.operator.use_ocp_driver_toolkit"
                    in json.dumps(status := policy_status(kube, helm.POLICY_NAME))
                    or NotYet(status)
                ),
            )
            kube.merge_patch(
                "ClusterPolicy",
                helm.POLICY_NAME,
                {"spec": {"driver": {"use_ocp_driver_toolkit": None}}},
            )
            wait_for("ready again", lambda: ready(kube), timeout=60)

            # The driver moves to NVIDIADriver pools: the operator makes the `default` one,
            # whose DaemonSet and node pool label are the operator's to remove on uninstall too.
            kube.merge_patch(
                "ClusterPolicy",
                helm.POLICY_NAME,
                {"spec": {"driver": {"enabled": True, "useNvidiaDriverCRD": True}}},
            )
            wait_for("the GPU node in the default pool", lambda: in_default_pool(kube), timeout=180)

            helm_.uninstall()
            assert "--delete-crd" in hooks.ran(helm.UNINSTALL_HOOK).args
        finally:
            operator.stop()
        wait_nothing_left(kube)
        # No CRD of the project is left (Helm never deletes crds/), so no resource of theirs;
        # no DaemonSet (wait_nothing_left), node label, annotation or taint either.
        assert [name for name in CRDS if kube.get("CustomResourceDefinition", name)] == []
        assert_nodes_as_before(kube, before)


def in_default_pool(kube: Kube) -> bool | NotYet:
    """Every GPU node in the default NVIDIADriver's pool, with that driver's DaemonSet."""
    pools = {
        n["metadata"]["name"]: n["metadata"].get("labels", {}).get(DRIVER_POOL)
        for n in kube.list_objects("Node")
        if "gpu" in n["metadata"]["name"]
    }
    owned = [
        d["metadata"]["name"]
        for d in kube.list_objects("DaemonSet", NS)
        if any(r.get("kind") == "NVIDIADriver" for r in d["metadata"].get("ownerReferences", []))
    ]
    if owned and pools and set(pools.values()) == {"default"}:
        return True
    return NotYet({"pools": pools, "NVIDIADriver DaemonSets": owned})
