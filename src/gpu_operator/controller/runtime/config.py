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
    # The safety net: a full pass that looks at every node. Everything the operator reads is
    # watched, so this bounds only how long an event lost to a bug could go unnoticed; 10 hours,
    # client-go's default resync. Each costs a full pass (0.5 CPU-s at 5,000 nodes): every 10
    # hours is 0.001 CPU-s a minute there (every 30 minutes was 0.018, a fifth of a converged
    # minute).
    resync_seconds: float = 36000.0
    write_concurrency: int = 8
