"""The OLM registry+v1 bundle: a ClusterServiceVersion, the CRDs, the metrics Service, metadata.

The CSV's Deployment spec, RBAC rules and images all come from ``manifests``, the source of
deploy/, so an OLM install runs exactly what ``kubectl apply -f deploy/`` runs.
"""

from __future__ import annotations

import base64
import json
import re
from typing import Any

from gpu_operator.api import API_VERSION, KIND, gpucluster, nvidiadriver
from gpu_operator.api.crd import clusterpolicy_crd, gpucluster_crd, nvidiadriver_crd
from gpu_operator.install import manifests, rbac
from gpu_operator.render import default_policy, render
from gpu_operator.render.facts import DEFAULT_OPERATOR_IMAGE, Facts
from gpu_operator.render.images import join_reference, split_reference, with_os_tag

PACKAGE = "gpu-operator"
CHANNEL = "stable"
CSV_FILE = "manifests/gpu-operator.clusterserviceversion.yaml"
CRD_FILE = "manifests/nvidia.com_clusterpolicies.yaml"
GPUCLUSTER_CRD_FILE = "manifests/nvidia.com_gpuclusters.yaml"
NVIDIADRIVER_CRD_FILE = "manifests/nvidia.com_nvidiadrivers.yaml"
# The NVIDIADriver in alm-examples: one driver for every GPU node, as NVIDIA's sample.
NVIDIADRIVER_EXAMPLE: dict[str, Any] = {
    "apiVersion": nvidiadriver.API_VERSION,
    "kind": nvidiadriver.KIND,
    "metadata": {"name": "nvidiadriver-sample"},
    "spec": {
        "driverType": "gpu",
        "usePrecompiled": False,
        "repository": "nvcr.io/nvidia",
        "image": "driver",
        "version": "580.95.05",
        "nodeSelector": {},
        "upgradePolicy": {"autoUpgrade": True, "maxParallelUpgrades": 1, "maxUnavailable": "25%"},
    },
}
SERVICE_FILE = f"manifests/{manifests.METRICS_SERVICE}_v1_service.yaml"
PDB_FILE = f"manifests/{manifests.NAME}_policy_v1_poddisruptionbudget.yaml"
ANNOTATIONS_FILE = "metadata/annotations.yaml"
DOCKERFILE = "bundle.Dockerfile"

# What `opm` and OLM read to know this image is a bundle; bundle.Dockerfile repeats them as
# LABELs because a bundle image is found by its labels, the file by the catalog builder.
ANNOTATIONS = {
    "operators.operatorframework.io.bundle.mediatype.v1": "registry+v1",
    "operators.operatorframework.io.bundle.manifests.v1": "manifests/",
    "operators.operatorframework.io.bundle.metadata.v1": "metadata/",
    "operators.operatorframework.io.bundle.package.v1": PACKAGE,
    "operators.operatorframework.io.bundle.channels.v1": CHANNEL,
    "operators.operatorframework.io.bundle.channel.default.v1": CHANNEL,
}

SEMVER = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?"
)

# A chip glyph drawn for this project: a green die with four pins a side and a white core.
ICON_SVG = (
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 64 64">'
    '<g fill="#2e9e4f">'
    '<path d="M19 3h4v9h-4zM27 3h4v9h-4zM35 3h4v9h-4zM43 3h4v9h-4z'
    "M19 52h4v9h-4zM27 52h4v9h-4zM35 52h4v9h-4zM43 52h4v9h-4z"
    "M3 19h9v4H3zM3 27h9v4H3zM3 35h9v4H3zM3 43h9v4H3z"
    'M52 19h9v4h-9zM52 27h9v4h-9zM52 35h9v4h-9zM52 43h9v4h-9z"/>'
    '<rect x="11" y="11" width="42" height="42" rx="6"/></g>'
    '<rect x="21" y="21" width="22" height="22" rx="3" fill="#fff"/>'
    '<rect x="26" y="26" width="12" height="12" rx="1" fill="#2e9e4f"/>'
    "</svg>"
)

DESCRIPTION = """\
Runs the software an NVIDIA GPU node needs, from a single `ClusterPolicy` resource: the driver
installer, the container toolkit, the device plugin, GPU feature discovery, the MIG manager,
the metrics exporter and a validator.

## What it does
* **Finds GPU nodes** from Node Feature Discovery labels (or `nvidia.com/gpu.present=true`),
  labels them, and keeps the stack on exactly those nodes.
* **Keeps the stack as the policy says.** Images, versions, pull secrets, env, resources and
  tolerations come from the policy; missing image parts are completed from defaults instead of
  producing broken image paths. Edits to the device-plugin, MIG or metrics ConfigMaps roll the
  pods that read them.
* **Upgrades drivers safely.** With `driver.upgradePolicy.autoUpgrade`, new driver versions
  roll across nodes within `maxParallelUpgrades` and `maxUnavailable`, evicting or draining
  GPU workloads first.
* **Cleans up.** Deleting the policy removes what it created, including the node labels and
  taints the operator added; labels and taints that were there before stay.

## Compatible with NVIDIA's ClusterPolicy
The CRD is `clusterpolicies.nvidia.com/v1`: existing ClusterPolicy documents apply unchanged.
Invalid policies are refused at `kubectl apply` or reported in the status with the field named.

## Before you install
Install Node Feature Discovery, or label GPU nodes `nvidia.com/gpu.present=true`. The operator
deploys its operands into the namespace it runs in; they are privileged DaemonSets, so that
namespace must allow privileged pods (`pod-security.kubernetes.io/enforce: privileged`).

## Getting started
Create a ClusterPolicy (the example below turns on the whole stack with defaults) and wait
until `kubectl get clusterpolicy` shows `ready`.
"""


def semver(version: str) -> str:
    """OLM orders bundles by semantic version; anything else would break upgrades later."""
    if not SEMVER.fullmatch(version):
        raise ValueError(f"bundle version must be semantic, such as 0.1.0 (got {version!r})")
    return version


def image_for(version: str) -> str:
    """The operator image a bundle of ``version`` runs: the default repository, tag v<version>."""
    parts = split_reference(DEFAULT_OPERATOR_IMAGE)
    return join_reference(parts.repository or "", parts.image or "", f"v{semver(version)}")


def related_images(image: str) -> list[dict[str, str]]:
    """Each image the operator runs or deploys by default, once, for mirroring tools.

    The ``*_IMAGE`` values as the Deployment sets them, plus the per-OS driver image the
    default node OS actually pulls (the env names the driver without its OS suffix).
    """
    found: dict[str, str] = {}
    for env, ref in manifests.image_env(image).items():
        name = "gpu-operator" if env == "OPERATOR_IMAGE" else env.removesuffix("_IMAGE")
        found.setdefault(ref, name.lower().replace("_", "-"))
        if env == "DRIVER_IMAGE":
            for os in Facts().node_oses:
                found.setdefault(with_os_tag(ref, os.tag), f"driver-{os.tag}")
    return [{"name": name, "image": ref} for ref, name in found.items()]


def _owned_resources() -> list[dict[str, str]]:
    """What a default ClusterPolicy creates, listed by OLM consoles under the policy."""
    objects = render(default_policy(), Facts())
    refs = {(o["kind"], o["metadata"]["name"], o["apiVersion"].rsplit("/", 1)[-1]) for o in objects}
    return [{"kind": k, "name": n, "version": v} for k, n, v in sorted(refs)]


def _descriptor(path: str, name: str, text: str, *x: str) -> dict[str, Any]:
    return {"path": path, "displayName": name, "description": text, "x-descriptors": list(x)}


UI = "urn:alm:descriptor:com.tectonic.ui:"
CONFIGMAP = "urn:alm:descriptor:io.kubernetes:ConfigMap"
# The fields a console form shows first: the ones a platform team changes most.
SPEC_DESCRIPTORS = [
    _descriptor(
        "driver.enabled", "Install the driver", "Off when hosts have one.", UI + "booleanSwitch"
    ),
    _descriptor(
        "driver.version", "Driver version", "Tag before the OS suffix: 580.95.05.", UI + "text"
    ),
    _descriptor(
        "driver.upgradePolicy.autoUpgrade",
        "Automatic driver upgrades",
        "Roll a new driver version across the GPU nodes.",
        UI + "booleanSwitch",
    ),
    _descriptor(
        "driver.upgradePolicy.maxParallelUpgrades",
        "Nodes upgraded at once",
        "0 means no limit.",
        UI + "number",
    ),
    _descriptor(
        "driver.upgradePolicy.maxUnavailable",
        "Max unavailable nodes",
        "A count or a percent such as 25%.",
        UI + "text",
    ),
    _descriptor(
        "devicePlugin.config.name",
        "Device plugin config",
        "ConfigMap of named device-plugin configs (time-slicing, MPS).",
        CONFIGMAP,
    ),
    _descriptor(
        "devicePlugin.config.default",
        "Default device plugin config",
        "Key used by nodes without the nvidia.com/device-plugin.config label.",
        UI + "text",
    ),
    _descriptor(
        "mig.strategy",
        "MIG strategy",
        "How MIG devices are advertised to pods.",
        UI + "select:none",
        UI + "select:single",
        UI + "select:mixed",
    ),
    _descriptor(
        "migManager.config.name",
        "MIG layouts",
        "ConfigMap of mig-parted layouts; nodes pick one with nvidia.com/mig.config.",
        CONFIGMAP,
    ),
    _descriptor("dcgmExporter.enabled", "GPU metrics", "Run the exporter.", UI + "booleanSwitch"),
]
STATUS_DESCRIPTORS = [
    _descriptor(
        "state",
        "State",
        "ready, notReady, or ignored for every policy but the oldest.",
        "urn:alm:descriptor:io.kubernetes.phase",
    ),
    _descriptor(
        "conditions",
        "Conditions",
        "Ready and Error, with the reason.",
        "urn:alm:descriptor:io.kubernetes.conditions",
    ),
    _descriptor("namespace", "Operand namespace", "Where the DaemonSets run.", UI + "text"),
]


def cluster_service_version(
    version: str, example: dict[str, Any], image: str | None = None
) -> dict[str, Any]:
    """The CSV for ``version``; ``example`` (a ClusterPolicy) becomes alm-examples."""
    version = semver(version)
    image = image or image_for(version)
    crd = clusterpolicy_crd()
    spec = manifests.deployment_spec(image)
    account = spec["template"]["spec"]["serviceAccountName"]
    icon = base64.b64encode(ICON_SVG.encode()).decode()
    return {
        "apiVersion": "operators.coreos.com/v1alpha1",
        "kind": "ClusterServiceVersion",
        "metadata": {
            "name": f"{PACKAGE}.v{version}",
            "annotations": {
                "alm-examples": json.dumps(
                    [example, gpucluster.example_document(), NVIDIADRIVER_EXAMPLE], indent=2
                ),
                "capabilities": "Seamless Upgrades",
                "categories": "AI/Machine Learning, Drivers and plugins",
                "containerImage": image,
                "description": "Installs and runs the NVIDIA GPU stack from one ClusterPolicy.",
                "repository": manifests.PROJECT_URL,
                "support": "gpu-operator project",
                "operatorframework.io/suggested-namespace": manifests.NAMESPACE,
            },
            "labels": {
                "operatorframework.io/arch.amd64": "supported",
                "operatorframework.io/os.linux": "supported",
            },
        },
        "spec": {
            "displayName": "GPU Operator",
            "description": DESCRIPTION,
            "version": version,
            "minKubeVersion": manifests.MIN_KUBE_VERSION,
            "maturity": "alpha",
            "provider": {"name": "gpu-operator project", "url": manifests.PROJECT_URL},
            "maintainers": [
                {"name": "gpu-operator maintainers", "email": "maintainers@gpu-operator.example"}
            ],
            "links": [
                {"name": "Source", "url": manifests.PROJECT_URL},
                {"name": "Documentation", "url": f"{manifests.PROJECT_URL}#readme"},
            ],
            "keywords": [
                "gpu",
                "nvidia",
                "cuda",
                "driver",
                "device-plugin",
                "mig",
                "time-slicing",
                "dcgm",
                "ai",
            ],
            "icon": [{"base64data": icon, "mediatype": "image/svg+xml"}],
            "customresourcedefinitions": {
                "owned": [
                    {
                        "name": crd["metadata"]["name"],
                        "version": API_VERSION.split("/")[1],
                        "kind": KIND,
                        "displayName": "Cluster Policy",
                        "description": "The GPU stack on every GPU node: which components, "
                        "which images, and how drivers are upgraded.",
                        "resources": _owned_resources(),
                        "specDescriptors": SPEC_DESCRIPTORS,
                        "statusDescriptors": STATUS_DESCRIPTORS,
                    },
                    {
                        "name": gpucluster_crd()["metadata"]["name"],
                        "version": gpucluster.VERSION,
                        "kind": gpucluster.KIND,
                        "displayName": "GPU Cluster",
                        "description": "The DRA-based GPU stack (NVIDIA DRA driver, "
                        "ResourceSlices, DeviceClasses) instead of the device plugin.",
                        "resources": [
                            {
                                "kind": "DaemonSet",
                                "name": "nvidia-dra-driver-kubelet-plugin",
                                "version": "v1",
                            },
                            {"kind": "DeviceClass", "name": "gpu.nvidia.com", "version": "v1"},
                            {"kind": "DeviceClass", "name": "mig.nvidia.com", "version": "v1"},
                        ],
                    },
                    {
                        "name": nvidiadriver_crd()["metadata"]["name"],
                        "version": nvidiadriver.VERSION,
                        "kind": nvidiadriver.KIND,
                        "displayName": "NVIDIA Driver",
                        "description": "One driver configuration (version, image, settings, "
                        "upgrade policy) for the GPU nodes it selects.",
                        "resources": [
                            {"kind": "DaemonSet", "name": "", "version": "v1"},
                            {"kind": "ServiceAccount", "name": "", "version": "v1"},
                        ],
                    },
                ]
            },
            "install": {
                "strategy": "deployment",
                "spec": {
                    "clusterPermissions": [
                        {"serviceAccountName": account, "rules": rbac.cluster_role()["rules"]}
                    ],
                    "permissions": [
                        {
                            "serviceAccountName": account,
                            "rules": rbac.role(manifests.NAMESPACE)["rules"],
                        }
                    ],
                    "deployments": [
                        {"name": manifests.NAME, "label": dict(manifests.SELECTOR), "spec": spec}
                    ],
                },
            },
            "installModes": [
                {"type": "OwnNamespace", "supported": True},
                {"type": "SingleNamespace", "supported": True},
                {"type": "MultiNamespace", "supported": False},
                {"type": "AllNamespaces", "supported": False},
            ],
            "relatedImages": related_images(image),
        },
    }


def bundle_objects(
    version: str, example: dict[str, Any], image: str | None = None
) -> dict[str, dict[str, Any]]:
    """manifests/ and metadata/ as file name -> object."""
    return {
        CSV_FILE: cluster_service_version(version, example, image),
        CRD_FILE: clusterpolicy_crd(),
        GPUCLUSTER_CRD_FILE: gpucluster_crd(),
        NVIDIADRIVER_CRD_FILE: nvidiadriver_crd(),
        SERVICE_FILE: manifests.metrics_service(namespace=None),
        PDB_FILE: manifests.disruption_budget(namespace=None),
        ANNOTATIONS_FILE: {"annotations": dict(ANNOTATIONS)},
    }


def bundle_dockerfile(version: str) -> str:
    labels = " \\\n".join(f"      {key}={value}" for key, value in ANNOTATIONS.items())
    return (
        f"# Generated by `gpu-operator bundle --version {version} --output-dir bundle/`.\n"
        "# The OLM bundle image; build it from this folder:\n"
        f"#   docker build -f bundle.Dockerfile -t <registry>/gpu-operator-bundle:v{version} .\n"
        "FROM scratch\n"
        f"LABEL {labels.lstrip()}\n"
        "COPY manifests /manifests/\n"
        "COPY metadata /metadata/\n"
    )


def bundle_files(version: str, example: dict[str, Any], image: str | None = None) -> dict[str, str]:
    """Every file of bundle/ (relative path -> text), ready to write."""
    header = manifests.generated_header(
        f"gpu-operator bundle --version {version} --output-dir bundle/"
    )
    files = {
        path: manifests.to_yaml([obj], header)
        for path, obj in bundle_objects(version, example, image).items()
    }
    files[DOCKERFILE] = bundle_dockerfile(version)
    return files
