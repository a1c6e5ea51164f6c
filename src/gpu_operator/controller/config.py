"""How the operator process is configured (flags and env of `gpu-operator run`)."""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpu_operator.render.facts import DEFAULT_OPERATOR_IMAGE


@dataclass(frozen=True)
class OperatorConfig:
    namespace: str = "gpu-operator"
    operator_image: str = DEFAULT_OPERATOR_IMAGE
    image_env: Mapping[str, str] = field(default_factory=dict)  # DRIVER_IMAGE, ...
    # Simulated GPUs for the operands (GPU_OPERATOR_SIMULATE on the operator): only an explicit
    # setting of a test or demo cluster; never set on a real one.
    simulate_gpus: str | None = None
    identity: str = field(default_factory=socket.gethostname)  # the Events' reporting instance
    debounce_seconds: float = 0.5  # let a burst of watch events settle into one pass
    # The safety net: a full pass that also reads the one unwatched kind (ServiceMonitor) again.
    # Events drive everything else, so this bounds only how long a deleted ServiceMonitor or a
    # missed event can last. Each costs a full pass (0.5 CPU-s at 5,000 nodes): every 30
    # minutes is 0.017 CPU-s a minute there (every 10, 0.05: half of a converged minute).
    resync_seconds: float = 1800.0
    write_concurrency: int = 8
