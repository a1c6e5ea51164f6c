"""The driver DaemonSet of one NVIDIADriver on one node pool, named and shaped as NVIDIA's.

``render_driver(spec, pool, names, facts)`` is pure. A *pool* is the nodes of one NVIDIADriver
that share an OS (and, for precompiled drivers, a kernel): each gets one DaemonSet
``nvidia-<type>-driver-<os>-<hash>`` whose hash is NVIDIA's input (the CR's uid, plus the
kernel for precompiled pools), so names survive operator restarts and match NVIDIA's.

Every setting of the spec reaches the pod: the k8s-driver-manager init container (its env over
NVIDIA's defaults), the precompiled image tag ``<branch>-<kernel>-<os>``, the nvidia-peermem
(RDMA), nvidia-fs (GDS) and gdrcopy side containers, and the ConfigMap/Secret volumes of
repoConfig, certConfig, licensingConfig, virtualTopologyConfig, kernelModuleConfig and
secretEnv. The objects are in ``templates/nvidia-driver/``; this module computes what they read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpu_operator.api.nvidiadriver import NVIDIADriverSpec
from gpu_operator.labels import DEPLOY_PREFIX, UNHEALTHY_TAINT
from gpu_operator.render.driver_pod import (
    PROBE_SCRIPT,
    additional_configs,
    config_digest,
    driver_container,
    driver_volumes,
    manager_container,
    peermem_container,
    side_container,
    side_image,
)
from gpu_operator.render.driver_pool import (
    COMPONENT_NAME,
    DEFAULT_GDRCOPY,
    DEFAULT_GDS,
    DEFAULT_MANAGER,
    KERNEL_LABEL,
    NVIDIA_COMPONENT,
    OS_VERSION_LABEL,
    OSTREE_LABEL,
    POOL_LABEL,
    PRECOMPILED_KERNEL_LABEL,
    PRECOMPILED_LABEL,
    TEMPLATE_FOLDER,
    DriverNames,
    ExtraConfig,
    Pool,
    driver_image,
    driver_names,
    string_hash,
)
from gpu_operator.render.engine import render_template, templates
from gpu_operator.render.metadata import owned_labels
from gpu_operator.render.wire import merge_maps


@dataclass(frozen=True)
class DriverValues:
    """What ``templates/nvidia-driver/`` reads (``v``)."""

    ns: str
    name: str
    app: str
    owned: Mapping[str, str]  # our labels on every object
    ds_labels: Mapping[str, str]
    pod_labels: Mapping[str, str]
    ds_annotations: Mapping[str, str]
    pod_annotations: Mapping[str, str]
    probe_configmap: str
    probe_script: str
    containers: tuple[Mapping[str, Any], ...]
    init_containers: tuple[Mapping[str, Any], ...]
    volumes: tuple[Mapping[str, Any], ...]
    pod_spec: Mapping[str, Any]  # scheduling and security fields of the pod
    openshift: bool = False  # the SCC and ClusterVersion rules exist only there


def driver_values(
    spec: NVIDIADriverSpec,
    pool: Pool,
    names: DriverNames,
    extra: ExtraConfig,
    image: str | None = None,
) -> DriverValues:
    """What the templates read; ``image`` overrides the pool's (the ClusterPolicy's own
    driver keeps its image tags)."""
    host_manager = spec.driver_type == "vgpu-host-manager"
    image = image or driver_image(spec, pool, extra.image_env.get("DRIVER_IMAGE"))
    config_mounts, config_volumes = additional_configs(spec, pool, extra)
    digest = config_digest(
        {"spec": spec.to_wire(), "image": image, "mounts": config_mounts, "pool": pool.os_tag}
    )
    resources = spec.resources.to_wire() if spec.resources is not None else None
    containers = [driver_container(spec, pool, image, extra, config_mounts, digest)]
    if spec.rdma and spec.rdma.enabled and not host_manager:
        containers.append(peermem_container(spec, image))
    if spec.gds and spec.gds.enabled:
        containers.append(
            side_container(
                "nvidia-fs-ctr",
                spec.gds,
                side_image(spec.gds, DEFAULT_GDS),
                "nvidia-gds-driver",
                "nvidia_fs",
                extra,
                resources,
            )
        )
    if spec.gdrcopy and spec.gdrcopy.enabled:
        containers.append(
            side_container(
                "nvidia-gdrcopy-ctr",
                spec.gdrcopy,
                side_image(spec.gdrcopy, DEFAULT_GDRCOPY),
                "nvidia-gdrcopy-driver",
                "gdrdrv",
                extra,
                resources,
            )
        )
    component = "nvidia-vgpu-host-manager" if host_manager else "nvidia-driver"
    precompiled = {PRECOMPILED_LABEL: "true" if spec.use_precompiled else "false"}
    if spec.use_precompiled and pool.kernel:
        precompiled[PRECOMPILED_KERNEL_LABEL] = pool.kernel
    owned = owned_labels(COMPONENT_NAME)
    nvidia_labels = {
        "app": names.app,
        NVIDIA_COMPONENT: component,
        OS_VERSION_LABEL: pool.os_tag,
        **precompiled,
    }
    # The spec's labels first; NVIDIA's and ours win (the controller finds pods by them).
    ds_labels = merge_maps(spec.labels, nvidia_labels, owned, {NVIDIA_COMPONENT: component})
    deploy = DEPLOY_PREFIX + ("vgpu-manager" if host_manager else "driver")
    node_selector = {deploy: "true", **pool.node_selector}
    if spec.use_precompiled and pool.kernel:
        node_selector[KERNEL_LABEL] = pool.kernel
    elif pool.rhcos_version:
        node_selector[OSTREE_LABEL] = pool.rhcos_version
    tolerations = [{"key": extra.gpu_taint_key, "operator": "Exists", "effect": "NoSchedule"}]
    if extra.quarantine_taint:  # a quarantined node's driver must stay, and restart there
        tolerations.append({"key": UNHEALTHY_TAINT, "operator": "Exists"})
    for toleration in spec.tolerations or []:
        wire = toleration.to_wire()
        if wire not in tolerations:
            tolerations.append(wire)
    affinity: dict[str, Any] = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {
                        "matchExpressions": [
                            {
                                "key": NVIDIA_COMPONENT,
                                "operator": "In",
                                "values": ["nvidia-driver", "nvidia-vgpu-manager"],
                            }
                        ]
                    },
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        }
    }
    if spec.node_affinity is not None:
        affinity["nodeAffinity"] = spec.node_affinity.to_wire()
    pod_spec: dict[str, Any] = {
        "affinity": affinity,
        "hostPID": True,
        "nodeSelector": node_selector,
        "priorityClassName": spec.priority_class_name or "system-node-critical",
        "serviceAccountName": names.name,
        "tolerations": tolerations,
    }
    if host_manager:
        pod_spec["terminationGracePeriodSeconds"] = 120
    if spec.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s} for s in spec.image_pull_secrets]
    side_secrets = [
        s
        for side in (spec.gds, spec.gdrcopy)
        if side is not None and side.enabled
        for s in side.image_pull_secrets or []
    ]
    for secret in side_secrets:
        pod_spec.setdefault("imagePullSecrets", [])
        if {"name": secret} not in pod_spec["imagePullSecrets"]:
            pod_spec["imagePullSecrets"].append({"name": secret})
    if spec.host_network is not None:
        pod_spec["hostNetwork"] = spec.host_network
        if spec.host_network:
            pod_spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    if spec.pod_security_context is not None:
        pod_spec["securityContext"] = spec.pod_security_context.to_wire()
    return DriverValues(
        ns=extra.namespace,
        name=names.name,
        app=names.app,
        owned=owned,
        ds_labels=ds_labels,
        pod_labels=ds_labels,
        ds_annotations={"openshift.io/scc": names.name},
        pod_annotations=merge_maps(
            spec.annotations, {"kubectl.kubernetes.io/default-container": "nvidia-driver-ctr"}
        ),
        probe_configmap=f"{names.name}-startup-probe",
        probe_script=PROBE_SCRIPT,
        containers=tuple(containers),
        init_containers=(manager_container(spec, extra, digest),),
        volumes=tuple(
            [
                *driver_volumes(spec, host_manager, f"{names.name}-startup-probe"),
                *config_volumes,
                *extra.volumes,
            ]
        ),
        pod_spec=pod_spec,
        openshift=extra.openshift,
    )


def render_driver(
    spec: NVIDIADriverSpec, pool: Pool, names: DriverNames, extra: ExtraConfig
) -> list[dict[str, Any]]:
    """The objects of one pool's driver: ServiceAccount, RBAC, probe ConfigMap, DaemonSet."""
    values = driver_values(spec, pool, names, extra)
    objects: list[dict[str, Any]] = []
    for name in templates(TEMPLATE_FOLDER):
        objects.extend(render_template(name, {"v": values}))
    return objects


# What the rest of the project imports from here (the pool and pod modules are details).
__all__ = [
    "DEFAULT_MANAGER",
    "KERNEL_LABEL",
    "POOL_LABEL",
    "PROBE_SCRIPT",
    "DriverNames",
    "DriverValues",
    "ExtraConfig",
    "Pool",
    "driver_image",
    "driver_names",
    "render_driver",
    "string_hash",
]
