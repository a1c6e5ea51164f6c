"""The OLM bundle, checked the way a CSV consumer (OLM, opm, a console) reads it."""

from __future__ import annotations

import base64
import json
import re
import xml.etree.ElementTree as ET
from typing import Any

import jsonschema
import pytest
import yaml

from gpu_operator.api import parse_document
from gpu_operator.api.crd import nvidiadriver_crd
from gpu_operator.api.gpucluster import parse_gpucluster
from gpu_operator.api.nvidiadriver import parse_driver_spec
from gpu_operator.install import bundle, manifests
from gpu_operator.render import default_policy, render
from gpu_operator.render.facts import DEFAULT_OPERATOR_IMAGE, Facts
from tests.paths import REPO
from tests.schema import prune_nulls, strict, validate_kubernetes

BUNDLE = REPO / "bundle"
EXAMPLE = yaml.safe_load((REPO / "examples" / "clusterpolicy.yaml").read_text())
INSTALL_MODES = {"OwnNamespace", "SingleNamespace", "MultiNamespace", "AllNamespaces"}


@pytest.fixture(scope="module")
def csv() -> dict[str, Any]:
    """The committed CSV (test_committed keeps it equal to the generator's)."""
    doc: dict[str, Any] = yaml.safe_load((BUNDLE / bundle.CSV_FILE).read_text())
    return doc


def manifest_objects() -> list[dict[str, Any]]:
    return [yaml.safe_load(p.read_text()) for p in sorted((BUNDLE / "manifests").glob("*.yaml"))]


def crd_schema() -> dict[str, Any]:
    crd = yaml.safe_load((BUNDLE / bundle.CRD_FILE).read_text())
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def test_csv_required_fields(csv: dict[str, Any]) -> None:
    assert csv["apiVersion"] == "operators.coreos.com/v1alpha1"
    assert csv["kind"] == "ClusterServiceVersion"
    assert csv["metadata"]["name"] == "gpu-operator.v0.1.0"
    spec = csv["spec"]
    assert spec["version"] == "0.1.0"
    assert spec["minKubeVersion"] == "1.33.0"
    for field in ("displayName", "description", "provider", "maintainers", "links", "keywords"):
        assert spec[field], field
    assert spec["maturity"] in {"planning", "pre-alpha", "alpha", "beta", "stable", "mature"}
    assert all(re.fullmatch(r"[^@\s]+@[^@\s]+\.[a-z]+", m["email"]) for m in spec["maintainers"])
    assert spec["install"]["strategy"] == "deployment"


def test_install_modes_are_own_and_single_namespace(csv: dict[str, Any]) -> None:
    modes = {m["type"]: m["supported"] for m in csv["spec"]["installModes"]}
    assert set(modes) == INSTALL_MODES
    assert modes == {
        "OwnNamespace": True,
        "SingleNamespace": True,
        "MultiNamespace": False,
        "AllNamespaces": False,
    }


def test_deployments_are_valid_apps_v1_specs(csv: dict[str, Any]) -> None:
    deployments = csv["spec"]["install"]["spec"]["deployments"]
    assert [d["name"] for d in deployments] == ["gpu-operator"]
    for d in deployments:
        wrapped = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": d["name"]},
            "spec": d["spec"],
        }
        assert validate_kubernetes(wrapped)


def test_deployment_and_rules_are_deploy_s(csv: dict[str, Any]) -> None:
    install = csv["spec"]["install"]["spec"]
    objects = {o["kind"]: o for o in manifests.deploy_objects()}
    assert install["deployments"][0]["spec"] == objects["Deployment"]["spec"]
    assert install["clusterPermissions"][0]["rules"] == objects["ClusterRole"]["rules"]
    assert install["permissions"][0]["rules"] == objects["Role"]["rules"]


def test_permissions_belong_to_the_deployment_s_service_account(csv: dict[str, Any]) -> None:
    install = csv["spec"]["install"]["spec"]
    accounts = {d["spec"]["template"]["spec"]["serviceAccountName"] for d in install["deployments"]}
    for key in ("permissions", "clusterPermissions"):
        assert {p["serviceAccountName"] for p in install[key]} == accounts, key


def test_every_image_the_deployment_names_is_a_related_image(csv: dict[str, Any]) -> None:
    related = csv["spec"]["relatedImages"]
    listed = {r["image"] for r in related}
    assert len({r["name"] for r in related}) == len(related), "relatedImages names repeat"
    assert len(listed) == len(related), "an image is listed twice"
    for d in csv["spec"]["install"]["spec"]["deployments"]:
        for c in d["spec"]["template"]["spec"]["containers"]:
            assert c["image"] in listed
            for env in c.get("env", []):
                if env["name"].endswith("_IMAGE"):
                    assert env["value"] in listed, env["name"]
    assert csv["metadata"]["annotations"]["containerImage"] in listed


def test_owned_crds_are_files_in_manifests(csv: dict[str, Any]) -> None:
    crds = {
        o["metadata"]["name"]: o
        for o in manifest_objects()
        if o["kind"] == "CustomResourceDefinition"
    }
    owned = csv["spec"]["customresourcedefinitions"]["owned"]
    assert [o["name"] for o in owned] == list(crds)
    for entry in owned:
        crd = crds[entry["name"]]
        assert entry["kind"] == crd["spec"]["names"]["kind"]
        assert entry["version"] in {v["name"] for v in crd["spec"]["versions"]}
        assert entry["displayName"] and entry["description"]


def _schema_at(schema: dict[str, Any], path: str) -> dict[str, Any] | None:
    node: dict[str, Any] | None = schema
    for part in path.split("."):
        node = ((node or {}).get("properties") or {}).get(part)
    return node


def test_descriptors_name_fields_that_exist(csv: dict[str, Any]) -> None:
    owned, _gpucluster, _nvidiadriver = csv["spec"]["customresourcedefinitions"]["owned"]
    assert owned["kind"] == "ClusterPolicy"
    schema = crd_schema()
    spec_paths = {d["path"] for d in owned["specDescriptors"]}
    status_paths = {d["path"] for d in owned["statusDescriptors"]}
    assert {"driver.enabled", "driver.version", "driver.upgradePolicy.autoUpgrade"} <= spec_paths
    assert {"mig.strategy", "devicePlugin.config.name"} <= spec_paths
    assert {"state", "conditions"} <= status_paths
    for path in spec_paths:
        assert _schema_at(schema["properties"]["spec"], path) is not None, path
    for path in status_paths:
        assert _schema_at(schema["properties"]["status"], path) is not None, path
    mig = next(d for d in owned["specDescriptors"] if d["path"] == "mig.strategy")
    strategy = _schema_at(schema["properties"]["spec"], "mig.strategy")
    assert strategy is not None
    assert {x.rsplit(":", 1)[-1] for x in mig["x-descriptors"]} == set(strategy["enum"])


def test_alm_examples_are_json_that_the_crd_and_models_accept(csv: dict[str, Any]) -> None:
    examples = json.loads(csv["metadata"]["annotations"]["alm-examples"])
    assert [e["kind"] for e in examples] == ["ClusterPolicy", "GPUCluster", "NVIDIADriver"]
    schema = strict(crd_schema())
    jsonschema.validate(prune_nulls(examples[0]), schema)
    parse_document(examples[0])
    gc_crd = yaml.safe_load((BUNDLE / bundle.GPUCLUSTER_CRD_FILE).read_text())
    gc_schema = strict(gc_crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    jsonschema.validate(prune_nulls(examples[1]), gc_schema)
    parse_gpucluster(examples[1])
    nvd_schema = strict(nvidiadriver_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    nvd_schema["properties"]["spec"].pop("required")  # defaulted by the API server
    jsonschema.validate(prune_nulls(examples[2]), nvd_schema)
    parse_driver_spec(examples[2]["spec"])


def test_alm_example_with_a_typo_is_refused() -> None:
    bad = json.loads(json.dumps(EXAMPLE))
    bad["spec"]["driver"]["upgradePolicy"]["autoUpgarde"] = True
    with pytest.raises(jsonschema.ValidationError, match="autoUpgarde"):
        jsonschema.validate(bad, strict(crd_schema()))


def test_other_manifests_validate_against_kubernetes() -> None:
    kinds = []
    for obj in manifest_objects():
        if obj["kind"] == "ClusterServiceVersion":
            continue
        assert validate_kubernetes(obj), obj["kind"]
        assert "namespace" not in obj["metadata"], "OLM chooses the namespace"
        kinds.append(obj["kind"])
    assert sorted(kinds) == [
        "CustomResourceDefinition",
        "CustomResourceDefinition",
        "CustomResourceDefinition",
        "PodDisruptionBudget",
        "Service",
    ]


def test_annotations_and_dockerfile_labels_agree() -> None:
    annotations = yaml.safe_load((BUNDLE / bundle.ANNOTATIONS_FILE).read_text())["annotations"]
    assert annotations == {
        "operators.operatorframework.io.bundle.mediatype.v1": "registry+v1",
        "operators.operatorframework.io.bundle.manifests.v1": "manifests/",
        "operators.operatorframework.io.bundle.metadata.v1": "metadata/",
        "operators.operatorframework.io.bundle.package.v1": "gpu-operator",
        "operators.operatorframework.io.bundle.channels.v1": "stable",
        "operators.operatorframework.io.bundle.channel.default.v1": "stable",
    }
    dockerfile = (BUNDLE / bundle.DOCKERFILE).read_text()
    labels = dict(re.findall(r"(operators\.operatorframework\.io\.[\w.]+)=(\S+)", dockerfile))
    assert labels == annotations
    instructions = [
        line.split()[0] for line in dockerfile.splitlines() if line and line[0].isupper()
    ]
    assert instructions == ["FROM", "LABEL", "COPY", "COPY"]
    assert "FROM scratch" in dockerfile
    for folder in ("manifests", "metadata"):
        assert f"COPY {folder} /{folder}/" in dockerfile
        assert (BUNDLE / folder).is_dir()


def test_icon_is_a_small_svg(csv: dict[str, Any]) -> None:
    (icon,) = csv["spec"]["icon"]
    assert icon["mediatype"] == "image/svg+xml"
    svg = base64.b64decode(icon["base64data"], validate=True)
    assert len(svg) < 4096
    root = ET.fromstring(svg)
    assert root.tag == "{http://www.w3.org/2000/svg}svg"


def test_bundle_version_is_semantic_and_tags_the_image() -> None:
    assert bundle.image_for("1.2.3") == DEFAULT_OPERATOR_IMAGE.rsplit(":", 1)[0] + ":v1.2.3"
    csv = bundle.cluster_service_version("1.2.3-rc.1", EXAMPLE)
    assert csv["metadata"]["name"] == "gpu-operator.v1.2.3-rc.1"
    assert csv["spec"]["install"]["spec"]["deployments"][0]["spec"]["template"]["spec"][
        "containers"
    ][0]["image"].endswith(":v1.2.3-rc.1")
    for bad in ("1.2", "v1.2.3", "01.2.3", "1.2.3 "):
        with pytest.raises(ValueError, match="semantic"):
            bundle.semver(bad)


def test_an_image_override_reaches_deployment_env_and_related_images() -> None:
    csv = bundle.cluster_service_version(
        "0.1.0", EXAMPLE, "mirror.example/gpu-operator@sha256:" + "a" * 64
    )
    images = {r["image"] for r in csv["spec"]["relatedImages"]}
    assert "mirror.example/gpu-operator@sha256:" + "a" * 64 in images
    assert not any(i.startswith("ghcr.io/") for i in images)


def test_bundle_files_are_the_tree_operator_sdk_expects() -> None:
    files = bundle.bundle_files("0.1.0", EXAMPLE)
    assert set(files) == {
        "manifests/gpu-operator.clusterserviceversion.yaml",
        "manifests/nvidia.com_clusterpolicies.yaml",
        "manifests/nvidia.com_gpuclusters.yaml",
        "manifests/nvidia.com_nvidiadrivers.yaml",
        "manifests/gpu-operator-metrics_v1_service.yaml",
        "manifests/gpu-operator_policy_v1_poddisruptionbudget.yaml",
        "metadata/annotations.yaml",
        "bundle.Dockerfile",
    }


def test_related_images_cover_what_a_default_policy_pulls(csv: dict[str, Any]) -> None:
    """A disconnected mirror built from relatedImages runs the default stack."""
    listed = {r["image"] for r in csv["spec"]["relatedImages"]}
    (container,) = csv["spec"]["install"]["spec"]["deployments"][0]["spec"]["template"]["spec"][
        "containers"
    ]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    facts = Facts(operator_image=env["OPERATOR_IMAGE"], image_env=env)
    pulled = {
        c["image"]
        for o in render(default_policy(), facts)
        if o["kind"] == "DaemonSet"
        for c in o["spec"]["template"]["spec"].get("initContainers", [])
        + o["spec"]["template"]["spec"]["containers"]
    }
    assert pulled and pulled <= listed, pulled - listed


def test_owned_resources_name_real_objects(csv: dict[str, Any]) -> None:
    owned, _gpucluster, _nvidiadriver = csv["spec"]["customresourcedefinitions"]["owned"]
    refs = owned["resources"]
    assert all(r["kind"] and r["name"] and r["version"] for r in refs)
    assert {"kind": "DaemonSet", "name": "nvidia-device-plugin-daemonset", "version": "v1"} in refs
