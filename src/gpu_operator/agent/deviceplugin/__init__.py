"""``gpu-operator agent device-plugin``: the kubelet device-plugin API for NVIDIA GPUs.

Pure parts: :mod:`settings` (config file + env), :mod:`resources` (what is advertised under
which name; :func:`advertised_resources` also gives simulated nodes their capacity),
:mod:`allocation` (GetPreferredAllocation and Allocate answers), :mod:`cdi` (CDI names and
spec), :mod:`health` (which XIDs count, when a fault clears), :mod:`configs` (which named config
applies). Shell: :mod:`server` (one gRPC server per resource), :mod:`agent` (the loops).
Only the pure parts are imported here, so a simulator computing capacity stays light.
"""

from gpu_operator.agent.deviceplugin.resources import (
    Device,
    ResourceError,
    advertised_resources,
    device_map,
)

__all__ = ["Device", "ResourceError", "advertised_resources", "device_map"]
