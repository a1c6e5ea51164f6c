"""A real local Kubernetes control plane for end-to-end tests, benchmarks and demos.

etcd, kube-apiserver, kube-controller-manager and kube-scheduler run for real on loopback; kwok
plays the kubelets of simulated GPU and CPU nodes, and `real_nodes=N` adds real nodes (kubelet,
containerd, runc, kube-proxy in their own namespaces: `realnodes`, configured by the pure
`nodeconfig`). Build the binaries once with `hack/testenv build`, then::

    cluster = testenv.start(gpu_nodes=2, cpu_nodes=1, real_nodes=2)
    with cluster.api_client() as api: ...
    cluster.load_image(Path("image.oci.tar"))  # into every real node's containerd
    cluster.stop()
"""

from .binaries import BinariesError, ensure_binaries, why_unbuildable
from .cluster import (
    Clients,
    Cluster,
    TestenvError,
    claim_state_dir,
    default_state_dir,
    load,
    start,
    stop,
    stray_markers,
)
from .nodes import (
    GPU_PRESENT_LABEL,
    KWOK_ANNOTATION,
    create_cpu_node,
    create_gpu_node,
    create_nodes,
    node_manifest,
    wait_nodes_ready,
)
from .processes import find_strays

__all__ = [
    "GPU_PRESENT_LABEL",
    "KWOK_ANNOTATION",
    "BinariesError",
    "Clients",
    "Cluster",
    "TestenvError",
    "claim_state_dir",
    "create_cpu_node",
    "create_gpu_node",
    "create_nodes",
    "default_state_dir",
    "ensure_binaries",
    "find_strays",
    "load",
    "node_manifest",
    "start",
    "stop",
    "stray_markers",
    "wait_nodes_ready",
    "why_unbuildable",
]
