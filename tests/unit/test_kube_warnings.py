"""The API server's warnings (a deprecated API or field) reach the operator's log, each once."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from urllib3 import HTTPHeaderDict

from gpu_operator import kube

DEPRECATED = '299 - "policy/v1beta1 PodDisruptionBudget is deprecated in v1.21+, use policy/v1"'
FIELD = '299 - "metadata.annotations[seccomp.security.alpha.kubernetes.io/pod]: non-functional"'


def headers(*warnings: str) -> HTTPHeaderDict:
    found = HTTPHeaderDict({"Content-Type": "application/json"})
    for value in warnings:
        found.add("Warning", value)
    return found


def test_each_warning_header_gives_its_text() -> None:
    assert kube.api_warnings(headers(DEPRECATED, FIELD)) == [
        "policy/v1beta1 PodDisruptionBudget is deprecated in v1.21+, use policy/v1",
        "metadata.annotations[seccomp.security.alpha.kubernetes.io/pod]: non-functional",
    ]
    assert kube.api_warnings(headers('299 - "a \\"quoted\\" word"')) == ['a "quoted" word']
    assert kube.api_warnings(headers("not the RFC's shape")) == ["not the RFC's shape"]
    assert kube.api_warnings(headers()) == []
    assert kube.api_warnings(None) == []


def test_a_warning_is_logged_once_per_process(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kube, "_warned", set())
    resp = SimpleNamespace(headers=headers(DEPRECATED), status=200, read=lambda: b"{}")
    with caplog.at_level(logging.WARNING, logger="gpu_operator.kube"):
        for _ in range(3):
            kube._body(resp, "GET", "/apis/policy/v1beta1/poddisruptionbudgets")
    said = [r.getMessage() for r in caplog.records if r.name == "gpu_operator.kube"]
    assert said == [
        "the API server warns about GET /apis/policy/v1beta1/poddisruptionbudgets: "
        "policy/v1beta1 PodDisruptionBudget is deprecated in v1.21+, use policy/v1"
    ]
