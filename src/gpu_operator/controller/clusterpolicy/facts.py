"""From observed cluster state to the inputs of ``render`` and of node labelling (pure)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from gpu_operator.api.spec import ClusterPolicySpec
from gpu_operator.labels import NFD_PREFIX, OS_ID, OS_VERSION
from gpu_operator.node_labels import NodePolicy, SandboxPolicy, Taint, is_gpu_node
from gpu_operator.render.components import REGISTRY, is_enabled
from gpu_operator.render.facts import DEFAULT_OPERATOR_IMAGE, Facts, NodeOS, Runtime
from gpu_operator.render.user_configs import referenced_configmaps
from gpu_operator.views import NodeView

_RUNTIMES: dict[str, Runtime] = {"containerd": "containerd", "cri-o": "crio", "docker": "docker"}


def node_os(node: NodeView) -> NodeOS | None:
    os_id, version = node.labels.get(OS_ID), node.labels.get(OS_VERSION)
    if not os_id or not version:
        return None
    return NodeOS(os_id.lower(), version)


def detect_runtime(nodes: Iterable[NodeView], fallback: Runtime) -> Runtime:
    """The runtime most GPU nodes report (``containerd://1.7.27`` -> containerd)."""
    seen: Counter[Runtime] = Counter()
    for node in nodes:
        scheme = node.container_runtime.split("://", 1)[0]
        if scheme in _RUNTIMES:
            seen[_RUNTIMES[scheme]] += 1
    return seen.most_common(1)[0][0] if seen else fallback


def gather_facts(
    nodes: Iterable[NodeView],
    spec: ClusterPolicySpec,
    *,
    namespace: str,
    configmap_hashes: Mapping[str, str],
    mps_configmaps: frozenset[str] = frozenset(),
    configmap_keys: Mapping[str, tuple[str, ...]] | None = None,
    operator_image: str = DEFAULT_OPERATOR_IMAGE,
    image_env: Mapping[str, str] | None = None,
    simulate_gpus: str | None = None,
) -> Facts:
    gpu_nodes = [n for n in nodes if is_gpu_node(n)]
    oses = sorted({os for n in gpu_nodes if (os := node_os(n)) is not None})
    fallback: Runtime = spec.operator.default_runtime or "containerd"
    hashes = {
        name: configmap_hashes[name]
        for name in referenced_configmaps(spec)
        if name in configmap_hashes
    }
    return Facts(
        configmap_keys=tuple(sorted((configmap_keys or {}).items())),
        namespace=namespace,
        runtime=detect_runtime(gpu_nodes, fallback),
        node_oses=tuple(oses),
        operator_image=operator_image,
        image_env=dict(image_env or {}),
        config_hashes=hashes,
        mps_configs=frozenset(n for n in referenced_configmaps(spec) if n in mps_configmaps),
        simulate_gpus=simulate_gpus,
    )


def node_policy(spec: ClusterPolicySpec) -> NodePolicy:
    """What every GPU node should carry under ``spec``."""
    taint = spec.gpu_node_taint
    mig_default = spec.mig_manager.config.default if spec.mig_manager.config else None
    sandbox = spec.sandbox_workloads
    return NodePolicy(
        deploy=tuple(c.name for c in REGISTRY if is_enabled(spec, c)),
        mig_only=frozenset(c.name for c in REGISTRY if c.mig_capable_only),
        taint=Taint(taint.key, taint.value, taint.effect) if taint.enabled else None,
        default_mig_config="all-disabled" if mig_default is None else (mig_default or None),
        sandbox=(
            SandboxPolicy(
                default_workload=sandbox.default_workload or "container",
                shared_nvswitch=spec.fabric_manager.mode == "shared-nvswitch",
                kata=sandbox.mode == "kata",
            )
            if sandbox.enabled
            else None
        ),
    )


def nfd_present(nodes: Iterable[NodeView]) -> bool:
    return any(k.startswith(NFD_PREFIX) for n in nodes for k in n.labels)
