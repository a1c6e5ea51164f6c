"""The simulated NVML's import path for agents, tests and benchmarks.

The simulation lives in :mod:`gpu_operator.agent.simnvml`, split by concern; this module keeps
every name that package exports importable from here.
"""

from gpu_operator.agent import simnvml
from gpu_operator.agent.simnvml import *  # noqa: F403

__all__ = simnvml.__all__
