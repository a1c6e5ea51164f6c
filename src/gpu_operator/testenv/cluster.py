"""Start, describe and stop a real control plane on loopback: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and kwok (which plays the simulated nodes' kubelets),
optionally with real nodes (kubelet, containerd, runc, kube-proxy; see `realnodes`), for which
the API server listens on the harness bridge instead of loopback.

All state lives in one directory (default `.testenv/` in the checkout): PKI, kubeconfigs, etcd
data, logs, the audit log and `state.json`, which records ports and PIDs so that `stop()` from
any later process tears down exactly what `start()` left running.

The one place to import these from; the code lives in modules split along its seams:

- `statedir`: the state dir, `state.json`, claiming a dir per session, strays, `TestenvError`
- `handle`: `Cluster` (what tests hold), `load()` and `stop()`
- `startup`: `start()`, the start-up procedure (component flags, PKI, readiness waits)
- `launch`: spawning components, restart loops, fail-fast waits during start-up
- `kwokconfig`: kwok's configuration (node and pod stages, simulated faults), the audit policy
"""

from __future__ import annotations

from .handle import Clients, Cluster, https_ok, load, stop
from .kwokconfig import AUDIT_POLICY, KWOK_CONFIG, NOT_READY, SIMULATED_FAULT_ENV
from .launch import restarted
from .startup import POD_CIDR, SERVICE_CIDR, START_TIMEOUT, start
from .statedir import (
    STATE_FILE,
    STRAY_NAMES,
    TestenvError,
    claim_state_dir,
    default_state_dir,
    stray_markers,
)

__all__ = [
    "AUDIT_POLICY",
    "KWOK_CONFIG",
    "NOT_READY",
    "POD_CIDR",
    "SERVICE_CIDR",
    "SIMULATED_FAULT_ENV",
    "START_TIMEOUT",
    "STATE_FILE",
    "STRAY_NAMES",
    "Clients",
    "Cluster",
    "TestenvError",
    "claim_state_dir",
    "default_state_dir",
    "https_ok",
    "load",
    "restarted",
    "start",
    "stop",
    "stray_markers",
]
