"""The ``compute-domain.nvidia.com`` DRA kubelet plugin: IMEX channels for a ComputeDomain's
workloads, and its IMEX daemons' claims (NVIDIA's compute-domain-kubelet-plugin)."""
