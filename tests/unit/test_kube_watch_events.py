"""Watch events lose managedFields before they are parsed, and nothing else."""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_operator.kube import WatchStream, _parse_event, without_managed_fields

FIELDS_V1 = {
    "f:metadata": {"f:labels": {".": {}, "f:app": {}}},
    "f:spec": {"f:containers": {'k:{"name":"driver"}': {".": {}, "f:env": {}}}},
    "f:status": {"f:conditions": {'k:{"type":"Ready"}': {"f:status": {}}}},
}


def pod(annotations: dict[str, str] | None = None, **meta: Any) -> dict[str, Any]:
    """A pod laid out as the API server writes it: ObjectMeta in Go field order."""
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": "nvidia-driver-daemonset-x",
            "namespace": "gpu-operator",
            "uid": "u-1",
            "labels": {"app": "nvidia-driver-daemonset"},
            "annotations": annotations or {},
            "ownerReferences": [{"kind": "DaemonSet", "name": "d", "uid": "ds-1"}],
            **meta,
            "managedFields": [
                {
                    "manager": "kube-controller-manager",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": "2026-11-27T10:00:00Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": FIELDS_V1,
                },
                {"manager": "kubelet", "fieldsV1": FIELDS_V1, "subresource": "status"},
            ],
        },
        "spec": {"nodeName": "gpu-node-0", "containers": [{"name": "driver"}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }


def line(obj: dict[str, Any], kind: str = "MODIFIED") -> bytes:
    """One event as the API server streams it (Go's encoding: no spaces)."""
    return json.dumps({"type": kind, "object": obj}, separators=(",", ":")).encode()


def without(obj: dict[str, Any]) -> dict[str, Any]:
    kept = copy.deepcopy(obj)
    kept["metadata"].pop("managedFields", None)
    return kept


def test_managed_fields_are_cut_and_everything_else_is_kept() -> None:
    obj = pod()
    cut = without_managed_fields(line(obj))
    assert len(cut) < len(line(obj)) / 2
    assert json.loads(cut) == {"type": "MODIFIED", "object": without(obj)}


def test_look_alikes_inside_strings_change_nothing() -> None:
    # Quotes inside a string are escaped, so these can never read as the keys they mimic.
    sneaky = ',"managedFields":[1]},"spec":{"nodeName":"elsewhere"}'
    obj = pod({"note": sneaky, "x": ']},"spec":'}, finalizers=["a"])
    event = {"type": "MODIFIED", "object": without(obj)}
    assert json.loads(without_managed_fields(line(obj))) == event
    obj["metadata"].pop("managedFields")
    assert without_managed_fields(line(obj)) == line(obj)  # only look-alikes: unchanged


def test_events_of_other_shapes_come_back_unchanged_and_parse_whole() -> None:
    config_map = {
        "kind": "ConfigMap",
        "metadata": {"name": "c", "managedFields": [{"manager": "m"}]},
        "data": {"spec": "x"},
    }
    assert without_managed_fields(line(config_map)) == line(config_map)
    # A spec further on that is not the object's: the cut would not parse, so it parses whole.
    revision = {
        "kind": "ControllerRevision",
        "metadata": {"name": "r", "managedFields": [{"manager": "m"}]},
        "data": {"spec": {"template": {"metadata": {"finalizers": ["f"]}, "spec": {}}}},
    }
    assert _parse_event(line(revision), compact=True)["object"] == revision
    assert _parse_event(line(pod()), compact=False)["object"] == pod()


def test_a_stream_parses_compacted_events_across_chunks() -> None:
    events = [line(pod()), line(pod({"a": "b"}), "ADDED")]
    data = b"\n".join(events) + b"\n"

    class Response:
        def stream(self, amt: Any, decode_content: bool) -> Any:
            yield from (data[i : i + 37] for i in range(0, len(data), 37))

        def shutdown(self) -> None: ...
        def close(self) -> None: ...
        def release_conn(self) -> None: ...

    got = [e for batch in WatchStream(Response(), compact=True).batches() for e in batch]
    assert [e["object"] for e in got] == [without(pod()), without(pod({"a": "b"}))]


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(st.text(max_size=12), st.text(max_size=40), max_size=4),
    st.lists(st.text(max_size=20), max_size=3),
)
def test_any_annotations_and_finalizers_survive_the_cut(
    annotations: dict[str, str], finalizers: list[str]
) -> None:
    obj = pod(annotations, finalizers=finalizers)
    assert _parse_event(line(obj), compact=True) == {"type": "MODIFIED", "object": without(obj)}
