"""The project's chart driven by the helm the testenv builds: one way for every e2e module that
installs, upgrades or uninstalls a release."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

from gpu_operator.install import helm
from tests.paths import REPO

CHART = REPO / helm.CHART_DIR
NS = "gpu-operator"
RELEASE = "gpu-operator"


class Helm:
    """The helm built with the control plane, with its own config and cache directories."""

    def __init__(self, bin_dir: Path, home: Path, kubeconfig: Path | None = None) -> None:
        self.binary = str(bin_dir / "helm")
        self.env = {
            **os.environ,
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
        }
        if kubeconfig is not None:
            self.env["KUBECONFIG"] = str(kubeconfig)

    def run(self, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [self.binary, *args], capture_output=True, text=True, env=self.env, timeout=420
        )
        if ok:
            assert done.returncode == 0, f"helm {' '.join(args)}:\n{done.stderr}"
        return done

    def install(self, *args: str, timeout: str = "3m") -> subprocess.CompletedProcess[str]:
        """`helm install` as the README shows it (values files or `--set` in ``args``),
        waiting for readiness."""
        return self.run(
            "install", RELEASE, str(CHART), "-n", NS, "--create-namespace", *args,
            "--wait", "--timeout", timeout,
        )  # fmt: skip

    def uninstall(self, timeout: str = "3m") -> subprocess.CompletedProcess[str]:
        """`helm uninstall` as the README shows it, waiting for what it deletes."""
        return self.run("uninstall", RELEASE, "-n", NS, "--wait", "--timeout", timeout)

    def template(self, *args: str) -> list[dict[str, Any]]:
        out = self.run("template", RELEASE, str(CHART), "-n", NS, *args).stdout
        return [d for d in yaml.safe_load_all(out) if d]
