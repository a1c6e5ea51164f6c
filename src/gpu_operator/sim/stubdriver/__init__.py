"""A stub NVIDIA driver: real ELF libraries and programs laid out like a driver root.

Tests run without a GPU; :mod:`gpu_operator.sim.nvml` fakes NVML inside Python. What it
cannot show is how a *container* gets the driver: ``libnvidia-ml.so.1``, ``libcuda.so.1``,
``nvidia-smi`` and the device nodes, bind-mounted or CDI-mounted from a driver root. This
package builds small C stand-ins for them (NVIDIA's sonames and versioned file names, a subset
of NVML's and the CUDA driver API's C functions) and lays them out in a driver root, so that a
missing mount makes a container fail as it would with NVIDIA's driver. Everything they print
says SIMULATED; each library exports ``gpu_operator_stub_driver`` (:data:`DRIVER_MARKER`).

- :mod:`.table`: the GPU table patched into libnvidia-ml and libcuda (format: its docstring)
- :mod:`.libraries`: the libraries and programs, and each layout's directories
- :mod:`.build`: :func:`build_stubs`, compiling them once per set of sources (needs gcc)
- :mod:`.layout`: :func:`plan_layout`, :func:`lay_out` and :func:`remove`
- :mod:`.migstate`: :func:`read_mig_state`, the MIG mode and devices the C library shows;
- :mod:`.compute`: :func:`read_compute_policy`, the compute mode and time-slice a GPU holds

Which GPUs a process sees (``c/stubdriver.h``): the device dir is ``<driver root>/dev`` when
``<driver root>/dev/nvidiactl`` exists, the driver root being the loaded library's directory
less its library directory (``/run/nvidia/driver/usr/lib/x86_64-linux-gnu`` ->
``/run/nvidia/driver``), else ``/dev`` when ``/dev/nvidiactl`` exists; without one,
``nvmlInit`` fails with NVML_ERROR_DRIVER_NOT_LOADED and ``cuInit`` with CUDA_ERROR_NO_DEVICE.
A GPU is visible when ``<device dir>/nvidia<minor>`` exists; indices follow ascending minors.
"""

from .build import NO_COMPILER, build_stubs, default_cache_dir, source_hash
from .compute import ComputePolicy, read_compute_policy, write_compute_policy
from .layout import (
    IMEX_CHANNELS_MAJOR,
    IMEX_MGMT_FILE,
    IMEX_MGMT_MINOR,
    PROC_DEVICES,
    Entry,
    lay_out,
    plan_layout,
    proc_devices_text,
    remove,
    replace_file,
)
from .libraries import BIN_DIRS, LIB_DIRS, LIBRARIES, PROBE, PROGRAMS, STYLES, Library, Style
from .migstate import MigRow, read_mig_state, write_mig_state
from .mps import MpsState, read_mps_state
from .table import (
    DRIVER_MARKER,
    STUB_MARKER,
    TABLE_MARKER,
    TABLE_SIZE,
    StubDriverError,
    StubGpu,
    StubTable,
    encode_table,
    parse_table,
    patch_table,
    read_table,
)

__all__ = [
    "BIN_DIRS",
    "DRIVER_MARKER",
    "IMEX_CHANNELS_MAJOR",
    "IMEX_MGMT_FILE",
    "IMEX_MGMT_MINOR",
    "LIBRARIES",
    "LIB_DIRS",
    "NO_COMPILER",
    "PROBE",
    "PROC_DEVICES",
    "PROGRAMS",
    "STUB_MARKER",
    "STYLES",
    "TABLE_MARKER",
    "TABLE_SIZE",
    "ComputePolicy",
    "Entry",
    "Library",
    "MigRow",
    "MpsState",
    "StubDriverError",
    "StubGpu",
    "StubTable",
    "Style",
    "build_stubs",
    "default_cache_dir",
    "encode_table",
    "lay_out",
    "parse_table",
    "patch_table",
    "plan_layout",
    "proc_devices_text",
    "read_compute_policy",
    "read_mig_state",
    "read_mps_state",
    "read_table",
    "remove",
    "replace_file",
    "source_hash",
    "write_compute_policy",
    "write_mig_state",
]
