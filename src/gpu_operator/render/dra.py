"""The cluster-wide objects of the DRA stack that do not depend on a node: DeviceClasses.

NVIDIA's names and CEL selectors: a class per device ``type`` the kubelet plugins publish
under the drivers ``gpu.nvidia.com`` and ``compute-domain.nvidia.com``. Data, not text: the
expressions are fixed strings with no user value in them.
"""

from __future__ import annotations

from typing import Any

from gpu_operator.api import computedomain as cd
from gpu_operator.api.gpucluster import DRIVER_NAME as DRIVER

# DeviceClass name -> the ``type`` attribute it selects.
DEVICE_CLASSES = {"gpu.nvidia.com": "gpu", "mig.nvidia.com": "mig", "vfio.gpu.nvidia.com": "vfio"}


def device_class(
    name: str, device_type: str, driver: str = DRIVER, extra: str = ""
) -> dict[str, Any]:
    expression = (
        f"device.driver == '{driver}' && device.attributes['{driver}'].type == '{device_type}'"
        + extra
    )
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {
            "name": name,
            "labels": {"app.kubernetes.io/managed-by": "gpu-operator"},
        },
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }


def device_classes() -> list[dict[str, Any]]:
    return [device_class(name, kind) for name, kind in DEVICE_CLASSES.items()]


def domain_device_classes() -> list[dict[str, Any]]:
    """NVIDIA's classes of the compute-domain driver: a daemon, and a domain's channel 0."""
    driver = cd.DRIVER_NAME
    return [
        device_class(cd.DAEMON_DEVICE_CLASS, "daemon", driver),
        device_class(
            cd.CHANNEL_DEVICE_CLASS, "channel", driver, f" && device.attributes['{driver}'].id == 0"
        ),
    ]
