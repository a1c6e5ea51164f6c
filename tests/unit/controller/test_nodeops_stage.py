"""The shared node and pod operations as API actions: one translation for both planners."""

from __future__ import annotations

from gpu_operator.controller.nodeops_stage import node_request
from gpu_operator.controller.notices import node_event
from gpu_operator.controller.runtime import actions
from gpu_operator.controller.snapshot import Snapshot
from gpu_operator.nodeops.operations import Cordon, DeletePod, Event, Evict, Uncordon
from tests.unit.controller.builders import CONFIG, NOW, STAMP

SNAP = Snapshot(now=NOW, stamp=STAMP, policies=(), nodes=())
COUNT = ("remediations", "drain", "failed")


def test_node_writes_are_patches_made_for_their_purpose() -> None:
    cordon, uncordon = Cordon("gpu-1", was_cordoned=False), Uncordon("gpu-1", quarantined=True)
    assert node_request(cordon, SNAP, CONFIG, purpose="upgrade") == actions.Patch(
        "Node", "gpu-1", cordon.patch(), "upgrade"
    )
    assert node_request(uncordon, SNAP, CONFIG, purpose="health", tally=COUNT) == actions.Patch(
        "Node", "gpu-1", uncordon.patch(), "health", tally=COUNT
    )


def test_pods_go_through_eviction_or_deletion_and_count_nothing() -> None:
    evict = Evict("w", "team", "gpu-1")
    delete = DeletePod("w", "team", True, "gpu-1")
    assert node_request(evict, SNAP, CONFIG, purpose="health", tally=COUNT) == actions.Evict(
        "w", "team"
    )
    assert node_request(delete, SNAP, CONFIG, purpose="health", tally=COUNT) == (
        actions.DeletePod("w", "team", force=True)
    )


def test_an_event_is_about_its_node_and_carries_the_tally() -> None:
    event = Event("gpu-1", "Warning", "GPUDrainIncomplete", "pods stay")
    assert node_request(event, SNAP, CONFIG, purpose="health", tally=COUNT) == node_event(
        "gpu-1", "Warning", "GPUDrainIncomplete", "pods stay", STAMP, CONFIG, COUNT
    )
