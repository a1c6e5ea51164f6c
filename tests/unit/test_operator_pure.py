"""Small pure pieces of the operator shell."""

from __future__ import annotations

from gpu_operator.controller.clusterpolicy.memory import summarize_errors
from gpu_operator.controller.runtime.watch import trim


def test_errors_are_grouped_by_reason() -> None:
    errors = [(f"ServiceAccount/sa-{i}", 'namespaces "gpu-operator" not found') for i in range(5)]
    errors.append(("DaemonSet/x", "forbidden"))
    assert summarize_errors(errors) == (
        'namespaces "gpu-operator" not found (ServiceAccount/sa-0, ServiceAccount/sa-1, '
        "ServiceAccount/sa-2 and 2 more); forbidden (DaemonSet/x)"
    )
    assert summarize_errors([]) is None


def test_index_values_keep_only_what_decisions_read() -> None:
    pod = {
        "metadata": {
            "name": "p", "namespace": "n", "uid": "u", "labels": {"a": "b"},
            "annotations": {"big": "x" * 1000}, "ownerReferences": [{"uid": "ds"}],
            "managedFields": [{"manager": "kcm"}],
        },
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]},
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "Ready", "status": "True", "lastProbeTime": None,
                 "lastTransitionTime": "2026-01-01T00:00:00Z"},
                {"type": "PodScheduled", "status": "True",
                 "lastTransitionTime": "2026-01-01T00:00:00Z"},
            ],
            "containerStatuses": [{"restartCount": 2, "ready": True, "image": "i"}],
        },
    }  # fmt: skip
    assert trim("pods", pod) == {
        "metadata": {"name": "p", "namespace": "n", "uid": "u", "labels": {"a": "b"},
                     "ownerReferences": [{"uid": "ds"}]},
        "spec": {"nodeName": "n1"},
        # Ready's transition time tells whether a validator re-validated a new driver; no
        # other condition is read.
        "status": {"phase": "Running",
                   "conditions": [{"type": "Ready", "status": "True",
                                   "lastTransitionTime": "2026-01-01T00:00:00Z"}],
                   "containerStatuses": [{"restartCount": 2, "ready": True}],
                   "initContainerStatuses": []},
    }  # fmt: skip
    revision = {"metadata": {"name": "r"}, "revision": 3, "data": {"spec": {"template": {}}}}
    assert trim("controllerrevisions", revision) == {"metadata": {"name": "r"}, "revision": 3}
    a = trim("configmaps", {"metadata": {"name": "c"}, "data": {"k": "1"}})
    b = trim("configmaps", {"metadata": {"name": "c"}, "data": {"k": "2"}})
    assert "data" not in a and a["hash"] != b["hash"]
