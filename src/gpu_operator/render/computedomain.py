"""The objects one ComputeDomain needs, as plain dicts: its IMEX daemons' DaemonSet and claim
template in the driver's namespace, and the channel template its workloads claim.

Names, labels, device classes and opaque configs are NVIDIA's (its DRA driver's templates), so
NVIDIA's kubelet plugin and daemon work with what is rendered here, and a cluster that ran
NVIDIA's controller keeps its objects' names. The daemon container is the one thing chosen by
the caller (:class:`DaemonSettings`): this project's image and the daemon stand-in by default,
or NVIDIA's image and its ``compute-domain-daemon`` (:meth:`DaemonSettings.nvidia`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpu_operator.api.computedomain import (
    CHANNEL_DEVICE_CLASS,
    DAEMON_DEVICE_CLASS,
    DRIVER_NAME,
    ComputeDomain,
    channel_config,
    daemon_config,
)
from gpu_operator.labels import COMPUTE_DOMAIN, COMPUTE_DOMAIN_TARGET
from gpu_operator.render.facts import DEFAULT_OPERATOR_IMAGE

DAEMON_PREFIX = "computedomain-daemon-"
DAEMON_CONTAINER = "compute-domain-daemon"  # also the name of the pod's claim
DAEMON_ACCOUNT = "compute-domain-daemon-service-account"
DAEMON_TARGET, WORKLOAD_TARGET = "Daemon", "Workload"  # COMPUTE_DOMAIN_TARGET's values
DAEMON_REQUEST, CHANNEL_REQUEST = "daemon", "channel"
MAX_NODES_PER_IMEX_DOMAIN = 18  # an NVL72 rack's compute trays

# What the daemon container runs from this project's image: the IMEX daemon stand-in (and,
# on a node with the real nvidia-imex, its launcher). ``check`` answers the probes.
STANDIN_DAEMON_COMMAND: tuple[str, ...] = ("gpu-operator", "agent", "compute-domain-daemon", "run")
STANDIN_CHECK_COMMAND: tuple[str, ...] = ("gpu-operator", "agent", "compute-domain-daemon", "check")
# What it runs from NVIDIA's image, as NVIDIA's DaemonSet template has it.
NVIDIA_DAEMON_IMAGE = "nvcr.io/nvidia/k8s-dra-driver-gpu"
NVIDIA_DAEMON_COMMAND: tuple[str, ...] = ("compute-domain-daemon", "-v", "$(LOG_VERBOSITY)", "run")
NVIDIA_CHECK_COMMAND: tuple[str, ...] = ("compute-domain-daemon", "-v", "$(LOG_VERBOSITY)", "check")


@dataclass(frozen=True)
class DaemonSettings:
    """Where a domain's daemons run and what they run; one for every domain."""

    namespace: str = "gpu-operator"
    image: str = DEFAULT_OPERATOR_IMAGE
    command: tuple[str, ...] = STANDIN_DAEMON_COMMAND
    check_command: tuple[str, ...] = STANDIN_CHECK_COMMAND
    image_pull_policy: str = "IfNotPresent"
    image_pull_secrets: tuple[str, ...] = ()
    max_nodes_per_imex_domain: int = MAX_NODES_PER_IMEX_DOMAIN
    log_verbosity: int = 1
    feature_gates: Mapping[str, bool] = field(default_factory=dict)
    priority_class_name: str | None = None

    @classmethod
    def nvidia(cls, namespace: str, image: str, **overrides: Any) -> DaemonSettings:
        """NVIDIA's daemon: its ``k8s-dra-driver-gpu`` image (``image``, with its tag) and
        command, what a real cluster with GB200/GB300 racks runs."""
        return cls(
            namespace=namespace,
            image=image,
            command=NVIDIA_DAEMON_COMMAND,
            check_command=NVIDIA_CHECK_COMMAND,
            **overrides,
        )


def daemon_name(uid: str) -> str:
    """The DaemonSet's name, and its claim template's: NVIDIA's, from the domain's uid."""
    return f"{DAEMON_PREFIX}{uid}"


def _claim_template(
    name: str, namespace: str, uid: str, target: str, request: str, device_class: str,
    parameters: dict[str, Any],
) -> dict[str, Any]:  # fmt: skip
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {COMPUTE_DOMAIN: uid, COMPUTE_DOMAIN_TARGET: target},
        },
        "spec": {
            "spec": {
                "devices": {
                    "requests": [{"name": request, "exactly": {"deviceClassName": device_class}}],
                    "config": [
                        {
                            "requests": [request],
                            "opaque": {"driver": DRIVER_NAME, "parameters": parameters},
                        }
                    ],
                }
            }
        },
    }


def workload_template(domain: ComputeDomain) -> dict[str, Any]:
    """The template ``spec.channel.resourceClaimTemplate.name`` names, in the domain's
    namespace: one channel of the domain (or all of them, ``allocationMode: All``)."""
    return _claim_template(
        domain.template_name,
        domain.namespace,
        domain.uid,
        WORKLOAD_TARGET,
        CHANNEL_REQUEST,
        CHANNEL_DEVICE_CLASS,
        channel_config(domain.uid, domain.spec.channel.allocation_mode),
    )


def daemon_template(domain: ComputeDomain, settings: DaemonSettings) -> dict[str, Any]:
    """The template each daemon pod's claim comes from, in the driver's namespace."""
    return _claim_template(
        daemon_name(domain.uid),
        settings.namespace,
        domain.uid,
        DAEMON_TARGET,
        DAEMON_REQUEST,
        DAEMON_DEVICE_CLASS,
        daemon_config(domain.uid),
    )


def _field(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _probe(command: tuple[str, ...], period: int, failures: int) -> dict[str, Any]:
    return {
        "exec": {"command": list(command)},
        "periodSeconds": period,
        "timeoutSeconds": 10,
        "failureThreshold": failures,
        "successThreshold": 1,
    }


def daemonset(domain: ComputeDomain, settings: DaemonSettings) -> dict[str, Any]:
    """The domain's IMEX daemons: one pod on each node its workloads run on (the nodes the
    kubelet plugin labels with the domain's uid), each holding a daemon claim.

    As NVIDIA's: root, every taint tolerated (a workload there needs its daemon), DNS with ndots 1
    (daemons find their peers by short names), a startup probe patient for 20 minutes (a
    daemon waits for its peers without being restarted), and the domain's identity in the
    environment, which NVIDIA's plugin also injects through CDI when it prepares the claim.
    """
    uid = domain.uid
    env = [
        {"name": "LOG_VERBOSITY", "value": str(settings.log_verbosity)},
        {"name": "MAX_NODES_PER_IMEX_DOMAIN", "value": str(settings.max_nodes_per_imex_domain)},
        {"name": "COMPUTE_DOMAIN_UUID", "value": uid},
        {"name": "COMPUTE_DOMAIN_NAME", "value": domain.name},
        {"name": "COMPUTE_DOMAIN_NAMESPACE", "value": domain.namespace},
        _field("NODE_NAME", "spec.nodeName"),
        _field("POD_IP", "status.podIP"),
        _field("POD_UID", "metadata.uid"),
        _field("POD_NAME", "metadata.name"),
        _field("POD_NAMESPACE", "metadata.namespace"),
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"},  # no GPU: the runtime's default
    ]
    if settings.feature_gates:
        gates = ",".join(f"{k}={str(v).lower()}" for k, v in sorted(settings.feature_gates.items()))
        env.append({"name": "FEATURE_GATES", "value": gates})
    container = {
        "name": DAEMON_CONTAINER,
        "image": settings.image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": list(settings.command),
        "env": env,
        "resources": {"claims": [{"name": DAEMON_CONTAINER}]},
        # As root, as NVIDIA's image runs: the daemon writes its IMEX config into the domain
        # directory the kubelet plugin made on the host. A crash before its own termination
        # message (a traceback, a refused write) is reported by its last log lines.
        "securityContext": {"runAsUser": 0},
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "startupProbe": {**_probe(settings.check_command, 1, 1200), "initialDelaySeconds": 0},
        "livenessProbe": _probe(settings.check_command, 60, 20),
        "readinessProbe": _probe(settings.check_command, 10, 1),
    }
    pod: dict[str, Any] = {
        "serviceAccountName": DAEMON_ACCOUNT,
        "nodeSelector": {COMPUTE_DOMAIN: uid},
        "dnsPolicy": "ClusterFirst",
        "dnsConfig": {"options": [{"name": "ndots", "value": "1"}]},
        "containers": [container],
        "tolerations": [
            {"operator": "Exists", "effect": effect}
            for effect in ("NoSchedule", "NoExecute", "PreferNoSchedule")
        ],
        "resourceClaims": [
            {"name": DAEMON_CONTAINER, "resourceClaimTemplateName": daemon_name(uid)}
        ],
    }
    if settings.priority_class_name:
        pod["priorityClassName"] = settings.priority_class_name
    if settings.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": s} for s in settings.image_pull_secrets]
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {
            "name": daemon_name(uid),
            "namespace": settings.namespace,
            "labels": {COMPUTE_DOMAIN: uid},
        },
        "spec": {
            "selector": {"matchLabels": {COMPUTE_DOMAIN: uid}},
            "template": {"metadata": {"labels": {COMPUTE_DOMAIN: uid}}, "spec": pod},
        },
    }


def render_domain(domain: ComputeDomain, settings: DaemonSettings) -> list[dict[str, Any]]:
    """Every object of one domain, in the order they are created: the daemon claim template
    before the DaemonSet whose pods claim from it, the workload template last."""
    return [
        daemon_template(domain, settings),
        daemonset(domain, settings),
        workload_template(domain),
    ]
