"""gpu-operator: installs and runs the NVIDIA GPU stack from one ClusterPolicy."""

__version__ = "0.1.0"
