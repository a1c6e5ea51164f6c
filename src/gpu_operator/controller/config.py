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
    resync_seconds: float = 600.0  # the safety net; events drive everything else
    write_concurrency: int = 8
