"""``gpu-operator agent cdi generate|list`` over a stub driver root (``sim.stubdriver``).

The stub is built with gcc (skipped without it, failed in CI). The CLI runs in a subprocess:
generating a spec loads the root's libnvidia-ml, and a stub library loaded into this process
would be what later tests' pynvml finds. Device nodes are real character devices, made only as
root: the tests that need them skip otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_operator.sim.nvml import build_simulated_nvml
from gpu_operator.sim.stubdriver import StubGpu, build_stubs, lay_out
from tests import prerequisites

VERSION = "580.95.05"
CUDA = 13000
SPEC = "a100-40gb:2"
SEED = "node"
LIB = "/usr/lib/x86_64-linux-gnu"
SONAME_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64")
NOT_ROOT = "device nodes are made only as root (mknod)"
REAL_DRIVER = "this machine has /dev/nvidiactl (a real driver): the stub would use /dev"


@pytest.fixture(scope="module")
def artefacts() -> Path:
    prerequisites.gcc()
    return build_stubs()


def gpus() -> list[StubGpu]:
    """The GPUs of SPEC as the simulated NVML names them, so the table and NVML agree."""
    sim = build_simulated_nvml(SPEC, seed=SEED, driver_version=VERSION)
    return [
        StubGpu(g.index, g.uuid, g.model.name, g.model.memory_mib, g.pci_bus_id)
        for g in sim.node.gpus
    ]


@pytest.fixture
def root(tmp_path: Path, artefacts: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip(NOT_ROOT)
    if Path("/dev/nvidiactl").exists():
        pytest.skip(REAL_DRIVER)
    path = tmp_path / "driver"
    lay_out(
        path,
        version=VERSION,
        cuda_version=CUDA,
        gpus=gpus(),
        artefacts=artefacts,
        simulate=SPEC,
        seed=SEED,
    )
    yield path


def cdi(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("CONTAINER_DRIVER_ROOT", "NVIDIA_DRIVER_ROOT", "GPU_OPERATOR_SIMULATE")
    }
    return subprocess.run(
        [sys.executable, "-m", "gpu_operator", "agent", "cdi", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def generate(*argv: str) -> dict[str, Any]:
    done = cdi("generate", *argv)
    assert done.returncode == 0, done.stderr
    doc: dict[str, Any] = json.loads(done.stdout)
    return doc


def mounts_by_container_path(spec: dict[str, Any]) -> dict[str, str]:
    return {m["containerPath"]: m["hostPath"] for m in spec["containerEdits"]["mounts"]}


def host_paths(spec: dict[str, Any]) -> list[str]:
    edits = [spec["containerEdits"], *(d["containerEdits"] for d in spec["devices"])]
    paths = [m["hostPath"] for e in edits for m in e.get("mounts", ())]
    return paths + [n["hostPath"] for e in edits for n in e.get("deviceNodes", ())]


def test_generate_names_every_gpu_and_the_driver_s_files(root: Path) -> None:
    spec = generate("--driver-root", str(root), "-o", "json")
    uuids = [g.uuid for g in gpus()]
    assert spec["kind"] == "nvidia.com/gpu"
    assert [d["name"] for d in spec["devices"]] == ["0", uuids[0], "1", uuids[1], "all"]
    devices = {d["name"]: d["containerEdits"]["deviceNodes"] for d in spec["devices"]}
    assert devices["1"] == [{"path": "/dev/nvidia1", "hostPath": f"{root}/dev/nvidia1"}]
    assert [n["path"] for n in devices["all"]] == ["/dev/nvidia0", "/dev/nvidia1"]
    edits = spec["containerEdits"]
    assert edits["env"] == ["NVIDIA_VISIBLE_DEVICES=void"]
    control = {n["path"]: n["hostPath"] for n in edits["deviceNodes"]}
    assert control["/dev/nvidiactl"] == f"{root}/dev/nvidiactl"
    assert control["/dev/nvidia-uvm"] == f"{root}/dev/nvidia-uvm"
    mounts = mounts_by_container_path(spec)
    for stem in ("libnvidia-ml", "libcuda"):
        real = f"{LIB}/{stem}.so.{VERSION}"
        assert mounts[real] == f"{root}{real}"  # at its root-relative path
        for directory in SONAME_DIRS:  # and at its soname where any glibc image looks
            assert mounts[f"{directory}/{stem}.so.1"] == f"{root}{real}"
    assert mounts["/usr/bin/nvidia-smi"] == f"{root}/usr/bin/nvidia-smi"
    for name in ("gsp_ga10x.bin", "gsp_tu10x.bin"):
        firmware = f"/lib/firmware/nvidia/{VERSION}/{name}"
        assert mounts[firmware] == f"{root}{firmware}"
    assert all(p.startswith(f"{root}/") for p in host_paths(spec))


def test_host_driver_root_is_the_host_path_of_everything(root: Path) -> None:
    spec = generate(
        "--driver-root", str(root), "--host-driver-root", "/run/nvidia/driver", "--output=json"
    )
    paths = host_paths(spec)
    assert paths and all(p.startswith("/run/nvidia/driver/") for p in paths), paths
    assert "/run/nvidia/driver/dev/nvidia0" in paths
    assert f"/run/nvidia/driver{LIB}/libcuda.so.{VERSION}" in paths


def test_output_file_format_follows_its_name(root: Path, tmp_path: Path) -> None:
    as_json, as_yaml = tmp_path / "cdi" / "nvidia.json", tmp_path / "cdi" / "nvidia.yaml"
    for path in (as_json, as_yaml):
        done = cdi(
            "generate", "--driver-root", str(root), "--output-file", str(path), "--kind", "x.y/z"
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout == ""
    assert json.loads(as_json.read_text())["kind"] == "x.y/z"
    assert not as_yaml.read_text().startswith("{")
    assert yaml.safe_load(as_yaml.read_text()) == json.loads(as_json.read_text())


def test_without_nvml_the_gpus_are_the_device_nodes(tmp_path: Path, artefacts: Path) -> None:
    """Libraries but no control node (no driver loaded): NVML fails, the nodes found count."""
    if Path("/dev/nvidiactl").exists():
        pytest.skip(REAL_DRIVER)
    root = tmp_path / "driver"
    lay_out(
        root,
        version=VERSION,
        cuda_version=CUDA,
        gpus=gpus(),
        artefacts=artefacts,
        device_nodes=False,
        simulate=SPEC,
        seed=SEED,
    )
    done = cdi("generate", "--driver-root", str(root), "-o", "json")
    assert done.returncode == 0, done.stderr
    assert "NVML unavailable" in done.stderr
    spec = json.loads(done.stdout)
    assert spec["devices"] == []  # no device nodes either: nothing to name
    assert f"{LIB}/libcuda.so.1" in mounts_by_container_path(spec)


def test_list_shows_the_driver_for_humans(root: Path) -> None:
    done = cdi("list", "--driver-root", str(root))
    assert done.returncode == 0, done.stderr
    lines = [line.split() for line in done.stdout.splitlines()]
    assert ["libcuda.so.1", f"{LIB}/libcuda.so.{VERSION}"] in lines
    assert ["libnvidia-nvvm70.so.4", f"{LIB}/libnvidia-nvvm70.so.4"] in lines
    assert ["nvidia-smi", "/usr/bin/nvidia-smi"] in lines
    assert done.stdout.startswith(f"driver {VERSION} under {root}\n")
    assert ["GPUs:", "/dev/nvidia0", "/dev/nvidia1"] in lines
    assert f"/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin" in done.stdout


@pytest.mark.parametrize("command", ["generate", "list"])
def test_an_empty_root_says_where_it_looked(tmp_path: Path, command: str) -> None:
    done = cdi(command, "--driver-root", str(tmp_path))
    assert done.returncode == 4  # no GPU driver
    assert done.stdout == ""
    assert "not found under driver root" in done.stderr
    assert f"{tmp_path}/usr/lib/x86_64-linux-gnu" in done.stderr
    assert f"{tmp_path}/usr/lib64" in done.stderr


def test_the_yaml_spec_is_plain_and_the_same_as_the_json(root: Path) -> None:
    """Devices share edits in memory; printed, each device carries its own (no YAML anchors,
    which some CDI consumers do not read)."""
    done = cdi("generate", "--driver-root", str(root))
    assert done.returncode == 0, done.stderr
    assert "&id" not in done.stdout and "*id" not in done.stdout
    assert yaml.safe_load(done.stdout) == generate("--driver-root", str(root), "-o", "json")


def test_a_program_off_the_default_path_also_goes_to_usr_bin(tmp_path: Path) -> None:
    """A driver under its own prefix (seen on a GPU machine: /usr/local/nvidia/{lib64,bin}) has
    nvidia-smi where no image's default PATH looks: the spec mounts it there and at
    /usr/bin/nvidia-smi, one host file."""
    from tests.unit.agent.driver_layouts import CACHE_HOST, driver_libs, executable, ld_cache

    driver_libs(tmp_path, "/usr/local/nvidia/lib64")
    ld_cache(tmp_path, [("libcuda.so.1", "/usr/local/nvidia/lib64/libcuda.so.1", CACHE_HOST)])
    smi = executable(tmp_path, "/usr/local/nvidia/bin/nvidia-smi")
    mounts = mounts_by_container_path(generate("--driver-root", str(tmp_path), "-o", "json"))
    assert mounts["/usr/local/nvidia/bin/nvidia-smi"] == str(smi)
    assert mounts["/usr/bin/nvidia-smi"] == str(smi)
