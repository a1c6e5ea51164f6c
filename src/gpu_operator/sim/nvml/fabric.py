"""A simulated multi-node NVLink fabric (GB200/GB300 NVL72): what each GPU's fabric info says.

Only GPUs whose profile says ``nvlink_fabric: true`` have one; the others answer NVML's fabric
calls with state NOT_SUPPORTED, as a GPU without NVLink fabric does. A node picks its fabric in
its spec with one item, ``fabric=<cluster uuid>.<clique id>[/<state>[/<status>]]``, e.g.
``"gb200:4,fabric=6f2e2f0a-5d4c-4b7e-9a51-0c2d4e6f8a10.1"`` (state completed, status success)
or ``...1/not-started`` or ``...1/completed/not-ready`` (a failed registration). Without the
item, fabric GPUs are in one default rack: :data:`DEFAULT_CLUSTER_UUID`, clique
:data:`DEFAULT_CLIQUE`, completed.

A GPU's fabric lives in the node's state file beside its faults, so a test changes one node's
fabric while its agents run (:meth:`~.library.SimulatedNvml.set_fabric` in-process,
:func:`~.injection.set_fabric` from outside) and every process of the node sees it.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pynvml

from gpu_operator.agent.nvml.fabric import COMPLETED, NOT_SUPPORTED, STATES, SUCCESS, status_code

from .profiles import FABRIC_ITEM, SimulationError

DEFAULT_CLUSTER_UUID = str(uuid.uuid5(uuid.NAMESPACE_URL, "gpu-operator/sim/nvl72"))
DEFAULT_CLIQUE = 1
SETTABLE_STATES = tuple(s for s in STATES.values() if s != NOT_SUPPORTED)
"""What a fabric GPU may be put in: not-supported is what GPUs without a fabric say."""


@dataclass(frozen=True)
class SimFabric:
    """One GPU's fabric registration: cluster and clique, state and status (the names of
    :mod:`gpu_operator.agent.nvml.fabric`: ``completed``, ``not-started``; ``success``,
    ``not-ready``...)."""

    cluster_uuid: str = DEFAULT_CLUSTER_UUID
    clique_id: int = DEFAULT_CLIQUE
    state: str = COMPLETED
    status: str = SUCCESS

    def check(self) -> SimFabric:
        """This fabric, or :class:`SimulationError` saying what is malformed."""
        try:
            uuid.UUID(self.cluster_uuid)
        except ValueError:
            raise SimulationError(f"fabric cluster UUID {self.cluster_uuid!r}: no UUID") from None
        if not 0 <= self.clique_id <= 0xFFFFFFFF:
            raise SimulationError(f"fabric clique id {self.clique_id}: not a 32-bit unsigned int")
        if self.state not in SETTABLE_STATES:
            raise SimulationError(
                f"fabric state {self.state!r}; known: {', '.join(SETTABLE_STATES)}"
            )
        if status_code(self.status) is None:
            raise SimulationError(f"fabric status {self.status!r}: not an NVML return code name")
        return self


DEFAULT_FABRIC = SimFabric()


def parse_fabric(text: str) -> SimFabric:
    """``<cluster uuid>.<clique id>[/<state>[/<status>]]`` (the value of a ``fabric=`` item)."""
    clique, *rest = text.strip().split("/")
    cluster, dot, clique_id = clique.rpartition(".")
    if not dot or not clique_id.isdigit() or len(rest) > 2:
        raise SimulationError(
            f"fabric {text!r}: expected <cluster uuid>.<clique id>[/<state>[/<status>]]"
        )
    state = rest[0] if rest else COMPLETED
    status = rest[1] if len(rest) > 1 else SUCCESS
    return SimFabric(cluster, int(clique_id), state, status).check()


def fabric_of_spec(spec: str | Sequence[str]) -> SimFabric | None:
    """The ``fabric=`` item of a node's spec; None when it has none (at most one)."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    found = [i.strip()[len(FABRIC_ITEM) :] for i in items if i.strip().startswith(FABRIC_ITEM)]
    if len(found) > 1:
        raise SimulationError(f"{len(found)} fabric items in {spec!r}: a node has one fabric")
    return parse_fabric(found[0]) if found else None


def changed(
    fabric: SimFabric | None, *, state: str | None = None, status: str | None = None
) -> SimFabric:
    """A fabric GPU's ``fabric`` with a new state and/or status; a GPU without one refuses."""
    if fabric is None:
        raise SimulationError("this GPU has no NVLink fabric (its profile is not gb200/gb300)")
    return dataclasses.replace(
        fabric, state=state or fabric.state, status=status or fabric.status
    ).check()


def nvml_fields(fabric: SimFabric | None) -> tuple[bytes, int, int, int]:
    """(clusterUuid, cliqueId, state, status) as NVML's fabric info structs hold them."""
    if fabric is None:
        return bytes(16), 0, pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED, pynvml.NVML_SUCCESS
    state = next(code for code, name in STATES.items() if name == fabric.state)
    status = status_code(fabric.status)
    assert status is not None  # checked when made
    return uuid.UUID(fabric.cluster_uuid).bytes, fabric.clique_id, state, status


# -- in the state file -----------------------------------------------------------------------
def to_doc(fabric: SimFabric | None) -> dict[str, Any] | None:
    return None if fabric is None else dataclasses.asdict(fabric)


def from_doc(doc: dict[str, Any] | None) -> SimFabric | None:
    return None if not doc else SimFabric(**doc)
