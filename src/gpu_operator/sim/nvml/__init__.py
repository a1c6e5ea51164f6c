"""A simulated NVML at the ctypes boundary, so the real pynvml wrappers run without a GPU.

pynvml resolves every C function by name on ``pynvml.nvmlLib`` and calls it with ctypes
arguments (``byref`` out-parameters, string buffers, struct arrays, opaque handle pointers),
turning a non-zero return code into ``NVMLError``. :func:`install_simulated_nvml` puts a
:class:`SimulatedNvml` library object there; ``nvmlInit`` then finds a library already loaded
and never touches ``libnvidia-ml.so.1``.

The simulation is stateful and follows the hardware's rules: MIG mode set/pending, GPU
instances placed on memory slices (overlap or a full profile fails with
``NVML_ERROR_INSUFFICIENT_RESOURCES``), compute instances inside them, destroy. MIG mode
changes follow the GPU profile: ``mode_change: immediate`` (Hopper) applies at once,
``mode_change: reset`` (A100) stays pending until the GPU is reset (``nvidia-smi --gpu-reset``;
here :meth:`SimulatedNvml.reset_gpu`, which :class:`~gpu_operator.agent.nvml.Nvml` calls).
A reset also destroys every GPU instance, as on hardware.

Several processes can share one simulated node's MIG state through a JSON state file
(``state_file=`` or ``GPU_OPERATOR_SIMULATE_STATE``), e.g. the MIG manager and discovery.
Metric readings vary smoothly with time; energy is their integral, so it only grows.

Hardware faults (XIDs, uncorrected ECC errors, row remapping pending or failed, a GPU fallen off
the bus, thermal or power-brake slowdown) are injected per GPU into that shared state, by
:meth:`SimulatedNvml.inject_fault` in-process or :func:`inject_fault` on the file, so every
process of the node sees them; every event set receives every XID logged after it registered.

Modules, by concern:

- :mod:`.profiles`: GPU models from ``sim/profiles/*.yaml`` and the ``PROFILE:COUNT`` spec
- :mod:`.devices`: the node's plain state (GPUs, GPU and compute instances)
- :mod:`.mig`: MIG rules (placement, instances, mode changes, reset) as plain functions
- :mod:`.telemetry`: metric curves over time
- :mod:`.hwfaults`: a GPU's injected hardware faults, as values, and their rules
- :mod:`.fabric`: a GPU's multi-node NVLink fabric (GB200/GB300), and the spec's ``fabric=``
- :mod:`.faults`: injected return codes, and the event sets reading XIDs
- :mod:`.injection`: injecting hardware faults through a node's state file
- :mod:`.persistence`: the state file shared between processes, under a lock
- :mod:`.cabi`: reading and writing ctypes arguments, packed handles
- :mod:`.node`: what the entry points act on; handle resolution
- :mod:`.system_calls`, :mod:`.device_calls`, :mod:`.metric_calls`, :mod:`.health_calls`,
  :mod:`.event_calls`, :mod:`.mig_calls`, :mod:`.fabric_calls`: the C entry points, named as
  in ``nvml.h``
- :mod:`.library`: the object under pynvml, dispatching to the entry points
- :mod:`.install`: :func:`build_simulated_nvml`, the one way to make one, and installing it
"""

from .devices import CI_SLICES, DGX_BUSES, SimCi, SimGi, SimGpu
from .fabric import DEFAULT_CLUSTER_UUID, SimFabric, fabric_of_spec, parse_fabric
from .hwfaults import FAULT_KINDS, GpuFaults
from .injection import clear_faults, inject_fault, read_faults, set_fabric
from .install import (
    DEFAULT_CUDA,
    DEFAULT_DRIVER,
    ENV_DRIVER,
    ENV_SEED,
    ENV_SIMULATE,
    ENV_STATE,
    SIM_STATE,
    build_simulated_nvml,
    install_from_environment,
    install_simulated_nvml,
    uninstall_simulated_nvml,
)
from .library import SimulatedNvml
from .profiles import (
    GiProfileSpec,
    GpuModel,
    SimulationError,
    available_profiles,
    load_model,
    parse_spec,
)

__all__ = [
    "CI_SLICES",
    "DEFAULT_CLUSTER_UUID",
    "DEFAULT_CUDA",
    "DEFAULT_DRIVER",
    "DGX_BUSES",
    "ENV_DRIVER",
    "ENV_SEED",
    "ENV_SIMULATE",
    "ENV_STATE",
    "FAULT_KINDS",
    "SIM_STATE",
    "GiProfileSpec",
    "GpuFaults",
    "GpuModel",
    "SimCi",
    "SimFabric",
    "SimGi",
    "SimGpu",
    "SimulatedNvml",
    "SimulationError",
    "available_profiles",
    "build_simulated_nvml",
    "clear_faults",
    "fabric_of_spec",
    "inject_fault",
    "install_from_environment",
    "install_simulated_nvml",
    "load_model",
    "parse_fabric",
    "parse_spec",
    "read_faults",
    "set_fabric",
    "uninstall_simulated_nvml",
]
