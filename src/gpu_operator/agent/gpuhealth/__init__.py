"""The ``GPUHealthy`` node condition, published by the device-plugin agent from NVML.

Pure parts: :mod:`settings` (the GPU_HEALTH_* env), :mod:`state` (per-GPU readings and XIDs ->
per-GPU health, with debounce and quiet period), :mod:`condition` (node health -> the condition,
the patch and Events), :mod:`reset` (the operator's reset request -> what to reset, the answer).
Shell: :mod:`monitor` (NVML readings in, Node writes out), used by both the kubelet-serving
plugin and ``--kwok-capacity``. The operator quarantines nodes whose condition is False.
"""

from gpu_operator.agent.gpuhealth.settings import HealthSettings, health_settings

__all__ = ["HealthSettings", "health_settings"]
