"""The README's install, first policy, upgrade-status and uninstall commands, run as written
(kubectl and the gpu-operator CLI) against the real control plane."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gpu_operator.kube import Kube
from tests import prerequisites
from tests.e2e.support import (
    NotYet,
    private_cluster,
    service_account_config,
    start_operator,
    still_there,
    wait_for,
)
from tests.paths import REPO

NS = "gpu-operator"


def run(kubeconfig: Path, *argv: str, stdin: str | None = None) -> str:
    env_cmd = [argv[0], "--kubeconfig", str(kubeconfig), *argv[1:]]
    done = subprocess.run(
        env_cmd, input=stdin, capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert done.returncode == 0, f"{' '.join(argv)}: {done.stderr}"
    return done.stdout


def test_readme_install_use_and_uninstall(testenv_bin_dir: Path) -> None:
    prerequisites.kubectl()
    with private_cluster(testenv_bin_dir, gpu_nodes=2, cpu_nodes=1) as cluster:
        kc = cluster.kubeconfig
        gpu_operator = [sys.executable, "-m", "gpu_operator"]
        image = "registry.example.com/gpu-operator:v0.1.0"  # the image the README pushes

        def deploy(*args: str) -> str:
            return subprocess.run(
                [*gpu_operator, "deploy", *args, "--image", image],
                capture_output=True, text=True, check=True, cwd=REPO,
            ).stdout  # fmt: skip

        # Another namespace, as the README shows (the output is checked here).
        other = deploy("-n", "gpus")
        assert "namespace: gpus" in other and image in other
        manifests = deploy()
        assert image in manifests

        run(kc, "kubectl", "apply", "--server-side", "-f", "-", stdin=manifests)
        # The Deployment's image cannot run here (kwok plays the kubelets): run the operator
        # in-process with the Deployment's own ServiceAccount instead.
        operator = start_operator(service_account_config(cluster, NS, "gpu-operator", ""), NS)
        try:
            run(kc, "kubectl", "apply", "-f", "examples/clusterpolicy.yaml")
            wait_for(
                "kubectl shows the policy ready",
                lambda: (
                    "ready" in (out := run(kc, "kubectl", "get", "clusterpolicy")).split()
                    or NotYet(out)
                ),
            )
            out = subprocess.run(
                [*gpu_operator, "upgrade", "status", "--kubeconfig", str(kc)],
                capture_output=True, text=True, check=True, cwd=REPO,
            ).stdout  # fmt: skip
            assert "done" in out
            run(kc, "kubectl", "delete", "clusterpolicy", "--all")
            run(kc, "kubectl", "delete", "gpucluster", "--all")
            with cluster.api_client() as api:
                kube = Kube(api)
                wait_for(
                    "policy gone",
                    lambda: (
                        not (left := kube.list_objects("ClusterPolicy")) or still_there(left[0])
                    ),
                )
                for node in kube.list_objects("Node"):
                    labels = node["metadata"].get("labels") or {}
                    assert not [k for k in labels if k.startswith("nvidia.com/")], labels
        finally:
            operator.stop()
        run(kc, "kubectl", "delete", "-f", "-", "--wait=false", stdin=manifests)
        with cluster.api_client() as api:
            kube = Kube(api)
            assert kube.get("ClusterRole", "gpu-operator") is None
            wait_for(
                "CRD removed",
                lambda: (
                    (crd := kube.get("CustomResourceDefinition", "clusterpolicies.nvidia.com"))
                    is None
                    or still_there(crd)
                ),
            )
