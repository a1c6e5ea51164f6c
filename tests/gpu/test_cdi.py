"""``agent cdi generate`` on NVIDIA's driver, and a container given the GPU by that spec alone.

The spec must carry what a CUDA program and nvidia-smi need (the versioned libraries and their
sonames, nvidia-smi, the device nodes, GSP firmware where the driver has it); where NVIDIA's
``nvidia-ctk`` is installed its spec's file set is printed beside ours (information, not
asserted). The container's image holds glibc and the CUDA probe only: ``nvidia-smi -L`` must list
the GPU and the probe must allocate, fill and read back 1 GiB of device memory in it.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from gpu_operator.agent.driverroot import discover_driver
from gpu_operator.agent.driverroot.discover import firmware_dirs
from gpu_operator.agent.inventory import Inventory
from gpu_operator.sim.stubdriver import PROBE
from tests.gpu import container
from tests.gpu.conftest import Driver
from tests.gpu.host import Probe, SmiGpu, agent

PROBE_BYTES = 1 << 30
PROBE_PATH = f"/usr/local/bin/{PROBE}"
NO_ROOT = "the CDI-only container needs root (mount namespaces, bind mounts, chroot)"
NO_UNSHARE = "the CDI-only container needs unshare and chroot (util-linux, coreutils)"


@pytest.fixture(scope="module")
def spec(driver: Driver) -> dict[str, Any]:
    out = agent("cdi", "generate", "--driver-root", driver.root, "-o", "json")
    generated: dict[str, Any] = json.loads(out)
    return generated


def container_paths(spec: Mapping[str, Any]) -> set[str]:
    """Every mount's containerPath in a spec, node-wide and per device."""
    edits = [spec.get("containerEdits") or {}]
    edits += [d.get("containerEdits") or {} for d in spec.get("devices") or []]
    return {m["containerPath"] for e in edits for m in e.get("mounts") or []}


def node_paths(spec: Mapping[str, Any]) -> set[str]:
    edits = [spec.get("containerEdits") or {}]
    edits += [d.get("containerEdits") or {} for d in spec.get("devices") or []]
    return {n["path"] for e in edits for n in e.get("deviceNodes") or []}


def mounts_by_path(spec: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["containerPath"]: m for m in (spec.get("containerEdits") or {}).get("mounts") or []}


def test_cdi_generate_carries_the_driver(
    driver: Driver, spec: dict[str, Any], smi_gpus: list[SmiGpu], inventory: Inventory
) -> None:
    version = smi_gpus[0].driver_version
    mounts = mounts_by_path(spec)
    paths = sorted(container_paths(spec))
    nodes = sorted(node_paths(spec))
    print(f"\nagent cdi generate --driver-root {driver.root}: {len(paths)} mounts, nodes {nodes}")
    for path in paths:
        print(f"  {path}")
    for stem in ("libcuda.so", "libnvidia-ml.so"):
        versioned = [p for p in paths if os.path.basename(p) == f"{stem}.{version}"]
        assert versioned, f"no {stem}.{version} in the spec"
        host_file = mounts[versioned[0]]["hostPath"]
        assert os.path.isfile(host_file) and not os.path.islink(host_file), host_file
        sonames = [p for p in paths if os.path.basename(p) == f"{stem}.1"]
        assert sonames, f"no {stem}.1 in the spec"
        for path in sonames:
            assert mounts[path]["hostPath"] == host_file
            assert "ro" in mounts[path]["options"]
    files = discover_driver(driver.root)
    smi = shutil.which("nvidia-smi")
    smi_in_root = [b for b in files.binaries if os.path.basename(b) == "nvidia-smi"]
    if smi_in_root:
        assert smi_in_root[0] in paths, f"nvidia-smi ({smi_in_root[0]}) is not in the spec"
        if os.path.isfile(os.path.join(driver.root, "usr/bin/nvidia-smi")):
            assert "/usr/bin/nvidia-smi" in paths
    else:
        print(
            f"  NOTE: nvidia-smi ({smi}) is not in the toolkit's binary dirs under "
            f"{driver.root}: the spec has none"
        )
    assert "/dev/nvidiactl" in nodes
    for gpu in inventory.gpus:
        assert f"/dev/nvidia{gpu.minor_number}" in nodes
        names = {d["name"] for d in spec["devices"]}
        assert {str(gpu.index), gpu.uuid} <= names
    if os.path.exists("/dev/nvidia-uvm"):
        assert "/dev/nvidia-uvm" in nodes
    firmware = sorted(
        path
        for base in firmware_dirs()
        for path in glob.glob(
            os.path.join(driver.root, base.lstrip("/"), "nvidia", version, "gsp*.bin")
        )
    )
    print(f"  GSP firmware on this machine: {firmware or 'none'}")
    if firmware:
        assert [p for p in paths if os.path.basename(p).startswith("gsp")], "no GSP firmware"


def test_nvidia_ctk_file_set_beside_ours(driver: Driver, spec: dict[str, Any]) -> None:
    """Information only: what NVIDIA's nvidia-ctk would mount that ours does not, and back."""
    ctk = shutil.which("nvidia-ctk")
    if ctk is None:
        pytest.skip("nvidia-ctk is not installed here: no comparison with NVIDIA's spec")
    done = subprocess.run(
        [ctk, "cdi", "generate", "--format", "json", "--driver-root", driver.root],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        print(f"\nnvidia-ctk cdi generate failed ({done.returncode}):\n{done.stderr[-2000:]}")
        return
    theirs = json.loads(done.stdout)
    ours_paths, their_paths = container_paths(spec), container_paths(theirs)
    print(f"\nnvidia-ctk: {len(their_paths)} mounts, ours: {len(ours_paths)}")
    print("  only in nvidia-ctk's: " + (", ".join(sorted(their_paths - ours_paths)) or "none"))
    print("  only in ours: " + (", ".join(sorted(ours_paths - their_paths)) or "none"))
    ours_nodes, their_nodes = node_paths(spec), node_paths(theirs)
    print(f"  device nodes only in nvidia-ctk's: {sorted(their_nodes - ours_nodes) or 'none'}")
    print(f"  device nodes only in ours: {sorted(ours_nodes - their_nodes) or 'none'}")


def test_the_cuda_probe_runs_on_the_host(driver: Driver, probe: Probe) -> None:
    """The probe itself, outside any container (its libcuda from the driver's library dir)."""
    out = probe.run(PROBE_BYTES, library_dir=driver.library_dir)
    print("\n" + out.rstrip())
    assert "check: ok" in out and "SIMULATED" not in out


@pytest.fixture
def container_dir(workdir: Path) -> Iterator[Path]:
    path = workdir / "container"
    path.mkdir()
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_a_cdi_only_container_runs_nvidia_smi_and_cuda(
    spec: dict[str, Any], inventory: Inventory, probe: Probe, container_dir: Path
) -> None:
    if os.geteuid() != 0:
        pytest.skip(NO_ROOT)
    if shutil.which("unshare") is None or shutil.which("chroot") is None:
        pytest.skip(NO_UNSHARE)
    gpu = inventory.gpus[0]
    edits = container.edits_for(spec, gpu.uuid)
    smi = sorted(m.container for m in edits.mounts if os.path.basename(m.container) == "nvidia-smi")
    assert smi, "the spec mounts no nvidia-smi: a CDI-only container cannot run it"
    image = container.build_image(container_dir / "image", probe.glibc, {PROBE_PATH: probe.path})
    in_image = sorted(
        str(p.relative_to(image)) for p in image.rglob("*") if p.is_file() or p.is_symlink()
    )
    print(f"\nimage: {in_image}")
    print(
        f"CDI device nvidia.com/gpu={gpu.uuid}: {len(edits.nodes)} device nodes, "
        f"{len(edits.mounts)} mounts, env {list(edits.env)}, {edits.hooks} hooks (not run)"
    )
    results = container.run(
        image,
        container_dir / "run",
        edits,
        {
            "nvidia-smi": [smi[0], "-L"],
            "probe": [PROBE_PATH, "--bytes", str(PROBE_BYTES)],
        },
    )
    for name, result in results.items():
        print(f"--- {name} (exit {result.rc}):\n{result.output.rstrip()}")
    listing = results["nvidia-smi"]
    assert listing.rc == 0, listing.output
    assert gpu.uuid in listing.output and gpu.name in listing.output
    probed = results["probe"]
    assert probed.rc == 0, probed.output
    assert f"cuMemAlloc {PROBE_BYTES} bytes: ok" in probed.output
    assert "check: ok" in probed.output
    assert "SIMULATED" not in probed.output, "the probe found the stub driver, not NVIDIA's"
