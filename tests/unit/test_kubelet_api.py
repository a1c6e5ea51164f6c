"""The generated kubelet API code is exactly what hack/gen-kubelet-protos.sh makes."""

from __future__ import annotations

import filecmp
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.paths import REPO

GENERATED = REPO / "src" / "gpu_operator" / "kubelet_api"


def _files(root: Path) -> list[str]:
    return sorted(
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.parent != root
    )


def test_generated_code_has_not_drifted(tmp_path: Path) -> None:
    if shutil.which("go") is None:
        pytest.skip("Go is needed to fetch k8s.io/kubelet's .proto files")
    out = tmp_path / "kubelet_api"
    subprocess.run(
        [str(REPO / "hack" / "gen-kubelet-protos.sh"), str(out)], check=True, capture_output=True
    )
    assert _files(out) == _files(GENERATED)
    _, mismatch, errors = filecmp.cmpfiles(out, GENERATED, _files(out), shallow=False)
    assert not mismatch and not errors, f"regenerate with hack/gen-kubelet-protos.sh: {mismatch}"


def test_stubs_speak_the_kubelet_method_names() -> None:
    """The gRPC paths the kubelet calls are fixed by the proto packages; a rename breaks them."""
    from gpu_operator.kubelet_api.deviceplugin.v1beta1 import api_pb2_grpc as dp
    from gpu_operator.kubelet_api.dra.v1 import api_pb2_grpc as dra
    from gpu_operator.kubelet_api.pluginregistration.v1 import api_pb2_grpc as reg
    from gpu_operator.kubelet_api.podresources.v1 import api_pb2_grpc as pr

    source = "\n".join(Path(m.__file__ or "").read_text() for m in (dp, dra, reg, pr))
    for path in (
        "/v1beta1.Registration/Register",
        "/v1beta1.DevicePlugin/ListAndWatch",
        "/v1beta1.DevicePlugin/GetPreferredAllocation",
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
        "/pluginregistration.Registration/GetInfo",
        "/v1.PodResourcesLister/List",
    ):
        assert path in source, path
