"""The DRA kubelet plugin (``gpu-operator agent dra-plugin``): GPUs as ResourceSlices, the
kubelet's DRA gRPC service, and CDI specs for prepared claims."""
