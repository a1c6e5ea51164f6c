"""The Grafana dashboard only queries metrics and labels the exporter produces."""

from __future__ import annotations

import json
import re

from gpu_operator.agent.exporter import FIELDS

from .conftest import REPO

DASHBOARD = REPO / "dashboards" / "gpu-operator-exporter.json"
EXPORTER_LABELS = {
    "gpu",
    "UUID",
    "pci_bus_id",
    "device",
    "modelName",
    "Hostname",
    "DCGM_FI_DRIVER_VERSION",
    "GPU_I_PROFILE",
    "GPU_I_ID",
    "pod",
    "namespace",
    "container",
}


def _exprs(doc: dict) -> list[str]:  # type: ignore[type-arg]
    found = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
    found += [v["definition"] for v in doc["templating"]["list"] if "definition" in v]
    return found


def test_dashboard_queries_exported_metrics_only() -> None:
    doc = json.loads(DASHBOARD.read_text())
    metrics = set()
    for expr in _exprs(doc):
        metrics |= set(re.findall(r"\b(DCGM_FI_[A-Z0-9_]+)(?=\s*[{[])", expr))
        for label in re.findall(r"([A-Za-z_]+)\s*(?:=~|!=|=)\s*\"", expr):
            assert label in EXPORTER_LABELS, (label, expr)
        for label in re.findall(r"by \(([^)]*)\)", expr):
            assert {x.strip() for x in label.split(",")} <= EXPORTER_LABELS, expr
    assert metrics <= set(FIELDS)
    assert len(metrics) >= 15  # nearly every NVML field has a panel


def test_dashboard_panels_are_well_formed() -> None:
    doc = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    assert doc["uid"] == "gpu-operator-exporter"
    for panel in doc["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${datasource}"
