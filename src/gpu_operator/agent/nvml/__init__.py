"""The one NVML adapter: pynvml in, typed inventory and metrics out.

Nothing above this package calls pynvml. :mod:`.loader` puts the driver's ``libnvidia-ml.so.1``
under pynvml, found by path in the driver root (never through a runtime hook), or the simulation
the command line registered with it; :mod:`.session` reads the GPUs; :mod:`.errors` turns every
failure into an :class:`NvmlError` subclass named for what the caller can do about it.
"""

from .errors import (
    GpuLost,
    InsufficientResources,
    InUse,
    InvalidArgument,
    InvalidState,
    NoPermission,
    NotFound,
    NotSupported,
    NvmlError,
    NvmlUnavailable,
    ResetRequired,
    error_for,
)
from .fabric import FabricError, GpuFabric, node_clique
from .loader import (
    ENV_SIMULATE,
    ENV_SIMULATE_STATE,
    Simulation,
    current_driver_root,
    driver_root_from_env,
    install_simulated,
    load_nvml,
    register_simulation,
    simulated,
    use_driver_root,
)
from .names import mig_profile_name
from .session import Nvml, probe

__all__ = [
    "ENV_SIMULATE",
    "ENV_SIMULATE_STATE",
    "FabricError",
    "GpuFabric",
    "GpuLost",
    "InUse",
    "InsufficientResources",
    "InvalidArgument",
    "InvalidState",
    "NoPermission",
    "NotFound",
    "NotSupported",
    "Nvml",
    "NvmlError",
    "NvmlUnavailable",
    "ResetRequired",
    "Simulation",
    "current_driver_root",
    "driver_root_from_env",
    "error_for",
    "install_simulated",
    "load_nvml",
    "mig_profile_name",
    "node_clique",
    "probe",
    "register_simulation",
    "simulated",
    "use_driver_root",
]
