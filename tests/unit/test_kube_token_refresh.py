"""The client's token hook runs before every request; the operator lets it run at most every
few seconds per configuration (``kube.api_configuration``)."""

from __future__ import annotations

import copy
import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from gpu_operator import kube
from gpu_operator.kube import api_configuration, refreshing_at_most_every

KUBECONFIG = {
    "apiVersion": "v1",
    "kind": "Config",
    "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
    "users": [{"name": "u", "user": {"token": "sa-token"}}],
    "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
    "current-context": "x",
}


def test_the_hook_runs_at_most_every_interval_per_configuration() -> None:
    runs: list[int] = []
    refresh = refreshing_at_most_every(lambda c: runs.append(id(c)), every_s=0.2)
    first = client.Configuration()
    for _ in range(50):
        refresh(first)
    assert runs == [id(first)]
    other = client.Configuration()  # its own schedule: not starved by the first's
    refresh(other)
    assert runs == [id(first), id(other)]
    time.sleep(0.25)
    refresh(first)
    assert runs[-1] == id(first) and len(runs) == 3


def test_requests_from_a_token_kubeconfig_do_not_each_reread_the_proxy_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loader's hook sets the host again, and the host's setter reads the proxy variables
    (every variable of the environment): that ran before each request, the Lease's included."""
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(KUBECONFIG))
    configuration = api_configuration(str(path))
    reads: list[int] = []
    real = client.configuration.getproxies
    monkeypatch.setattr(client.configuration, "getproxies", lambda: reads.append(1) or real())
    for _ in range(100):  # what the client does before each request
        auth = configuration.auth_settings()
    assert auth["BearerToken"]["value"] == "Bearer sa-token"
    assert len(reads) <= 1
    watch = copy.deepcopy(configuration)  # the runner's watch configuration
    assert watch.auth_settings()["BearerToken"]["value"] == "Bearer sa-token"
    assert kube.TOKEN_REFRESH_S >= 5
