"""The stub NVIDIA driver: real libraries, nvidia-smi and the CUDA probe, run as processes.

Built once for the module (needs gcc: skipped without it, failed in CI). Each test lays out
a driver root in its tmp_path. Device nodes are real character devices as root; otherwise
plain files stand in for them (the stub only checks that they exist).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_operator.agent.dra.computedomain.decide import capability_device
from gpu_operator.agent.driverroot import char_device_majors
from gpu_operator.sim import stubdriver as sd
from gpu_operator.sim.stubdriver import StubDriverError, StubGpu, StubTable, lay_out
from tests import prerequisites

VERSION = "580.95.05"
CUDA = 13000
# Given out of order: NVML and CUDA number them by ascending minor.
GPUS = tuple(
    StubGpu(minor, f"GPU-{uuid}", name, mib, f"00000000:{bus}:00.0")
    for minor, uuid, name, mib, bus in (
        (3, "33333333-0000-4000-8000-000000000003", "Tesla T4", 15360, "0A"),
        (0, "00000000-1111-4000-8000-0123456789ab", "NVIDIA A100-SXM4-40GB", 40960, "07"),
        (1, "11111111-0000-4000-8000-000000000001", "NVIDIA H100 80GB HBM3", 81559, "08"),
    )
)
LIST = [
    "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-00000000-1111-4000-8000-0123456789ab)",
    "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-11111111-0000-4000-8000-000000000001)",
    "GPU 2: Tesla T4 (UUID: GPU-33333333-0000-4000-8000-000000000003)",
]
FAILED = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure "
    "that the latest NVIDIA driver is installed and running."
)
LIB = "usr/lib/x86_64-linux-gnu"
C_DIR = Path(sd.__file__).parent / "c"


@pytest.fixture(scope="module")
def artefacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    prerequisites.gcc()
    return sd.build_stubs(tmp_path_factory.mktemp("stubdriver-build"))


@pytest.fixture
def root(tmp_path: Path, artefacts: Path) -> Iterator[Path]:
    if Path("/dev/nvidiactl").exists():
        pytest.skip("this machine has /dev/nvidiactl (a real driver): the stub would use /dev")
    yield lay_driver(tmp_path / "driver", artefacts)


def lay_driver(
    root: Path, artefacts: Path, version: str = VERSION, style: sd.Style = "ubuntu"
) -> Path:
    created = lay_out(
        root, version=version, cuda_version=CUDA, gpus=GPUS, style=style, artefacts=artefacts
    )
    for entry in sd.plan_layout(version=version, cuda_version=CUDA, gpus=GPUS):
        if entry.kind == "node" and entry.path not in created:  # not root: stand-ins
            (root / entry.path).parent.mkdir(exist_ok=True)
            (root / entry.path).touch()
    return root


def run(root: Path, *argv: str, lib: str | None = LIB) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    if lib is not None:
        env["LD_LIBRARY_PATH"] = str(root / lib)
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)


def smi(root: Path, *args: str, lib: str | None = LIB) -> subprocess.CompletedProcess[str]:
    return run(root, str(root / "usr/bin/nvidia-smi"), *args, lib=lib)


def probe(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run(root, str(root / "usr/bin" / sd.PROBE), "--bytes", "1048576", *args)


def test_table_round_trips_and_patches_in_place() -> None:
    table = StubTable(VERSION, CUDA, GPUS, simulate="a100-40gb:1,h100-80gb:1,t4:1", seed="n1")
    encoded = sd.encode_table(table)
    assert len(encoded) == sd.TABLE_SIZE and encoded.startswith(sd.TABLE_MARKER)
    assert sd.parse_table(encoded) == table
    assert b"\ngpu 3 GPU-3333" in encoded and b"\ncuda 13000\n" in encoded
    blank = sd.encode_table(StubTable("1.0", 0))
    library = b"ELF..." + blank + b"...rest"
    patched = sd.patch_table(library, table)
    assert len(patched) == len(library) and patched.endswith(b"...rest")
    assert sd.parse_table(patched) == table
    with pytest.raises(StubDriverError, match="no GPU table"):
        sd.patch_table(b"no marker here", table)
    with pytest.raises(StubDriverError, match="two GPU table markers"):
        sd.patch_table(library + blank, table)
    for bad in (
        StubTable(VERSION, CUDA, (GPUS[0], GPUS[0])),
        StubTable(VERSION, CUDA, (StubGpu(0, "GPU-nope", "x", 1, "00000000:07:00.0"),)),
        StubTable(VERSION, CUDA, (StubGpu(255, GPUS[0].uuid, "x", 1, "00000000:07:00.0"),)),
        StubTable("580 95", CUDA),
    ):
        with pytest.raises(StubDriverError):
            sd.encode_table(bad)


def test_plan_puts_each_style_where_its_distribution_does() -> None:
    for style in sd.STYLES:
        lib_dir, bin_dir = sd.LIB_DIRS[style], sd.BIN_DIRS[style]
        plan = sd.plan_layout(version=VERSION, cuda_version=CUDA, gpus=GPUS, style=style)
        links = {e.path: e.target for e in plan if e.kind == "link"}
        files = {e.path for e in plan if e.kind in ("library", "program")}
        assert links[f"{lib_dir}/libcuda.so.1"] == f"libcuda.so.{VERSION}"
        assert links[f"{lib_dir}/libcuda.so"] == "libcuda.so.1"
        assert links[f"{lib_dir}/libnvidia-ml.so"] == "libnvidia-ml.so.1"
        assert links[f"{lib_dir}/libnvidia-nvvm.so.4"] == f"libnvidia-nvvm.so.{VERSION}"
        assert f"{lib_dir}/libnvidia-cfg.so" not in links
        assert f"{lib_dir}/libnvidia-gpucomp.so.{VERSION}" in files
        assert f"{lib_dir}/libnvidia-nvvm70.so.4" in files
        assert {f"{bin_dir}/nvidia-smi", f"{bin_dir}/{sd.PROBE}"} <= files
    nodes = {e.path.removeprefix("dev/"): e.device for e in plan if e.kind == "node"}
    gpu_nodes = {"nvidia0": (195, 0), "nvidia1": (195, 1), "nvidia3": (195, 3)}
    ctl_nodes = {"nvidiactl": (195, 255), "nvidia-uvm": (1, 3), "nvidia-uvm-tools": (1, 3)}
    caps = {k: v for k, v in nodes.items() if k.startswith("nvidia-caps/")}
    assert {k: v for k, v in nodes.items() if k not in caps} == gpu_nodes | ctl_nodes
    # MIG capability nodes: config, monitor and every GI/CI access node of each GPU present
    # (135 a GPU), with the kernel's minors (gpu3/gi0/access is 3 + 135 * 3).
    assert len(caps) == 2 + 135 * len(GPUS)
    assert caps["nvidia-caps/nvidia-cap1"] == (236, 1)
    assert caps[f"nvidia-caps/nvidia-cap{3 + 135 * 3}"] == (236, 3 + 135 * 3)
    assert f"nvidia-caps/nvidia-cap{3 + 135 * 2}" not in caps  # no GPU of minor 2
    plan = sd.plan_layout(version=VERSION, cuda_version=CUDA, gpus=GPUS, device_nodes=False)
    assert not [e for e in plan if e.kind == "node"]


def test_only_a_node_with_an_nvlink_fabric_has_the_imex_channels_device() -> None:
    plain = sd.plan_layout(version=VERSION, cuda_version=CUDA, gpus=GPUS)
    fabric = sd.plan_layout(version=VERSION, cuda_version=CUDA, gpus=GPUS, imex_channels=1)
    assert not [e for e in plain if "imex" in e.path]
    assert not [e for e in plain if e.path.endswith(f"nvidia-cap{sd.IMEX_MGMT_MINOR}")]
    channels = [e for e in fabric if e.path.startswith("dev/nvidia-caps-imex-channels/")]
    assert [(e.kind, e.path, e.device) for e in channels] == [
        ("node", "dev/nvidia-caps-imex-channels/channel0", (sd.IMEX_CHANNELS_MAJOR, 0))
    ]
    texts = {e.path: e.text for e in fabric if e.kind == "text"}
    majors = char_device_majors(texts[sd.PROC_DEVICES])
    assert majors == {
        "nvidia-frontend": 195,
        "nvidia-caps": 236,
        "nvidia-caps-imex-channels": sd.IMEX_CHANNELS_MAJOR,
    }
    # The capability the IMEX daemon is given, as the DRA plugin reads it from /proc.
    mgmt = capability_device(texts[sd.IMEX_MGMT_FILE], majors["nvidia-caps"])
    nodes = {e.path: e.device for e in fabric if e.kind == "node"}
    assert nodes[mgmt.path.lstrip("/")] == (mgmt.major, mgmt.minor)
    plain_text = next(e.text for e in plain if e.path == sd.PROC_DEVICES)
    assert "nvidia-caps-imex-channels" not in char_device_majors(plain_text)
    without_nodes = sd.plan_layout(
        version=VERSION, cuda_version=CUDA, gpus=GPUS, device_nodes=False, imex_channels=1
    )
    assert not [e for e in without_nodes if e.kind == "node"]


def test_the_nvml_loader_knows_the_stub_by_its_marker() -> None:
    from gpu_operator.agent.nvml import loader  # spelled there: the loader imports no simulation

    assert loader.STUB_MARKER == sd.STUB_MARKER


def test_python_and_c_agree_on_the_format() -> None:
    header = (C_DIR / "stubdriver.h").read_text()
    assert f'#define STUB_TABLE_MARKER "{sd.TABLE_MARKER.decode()}"' in header
    assert f"#define STUB_TABLE_SIZE {sd.TABLE_SIZE}" in header
    assert f'#define STUB_DRIVER_MARKER "{sd.DRIVER_MARKER}"' in header
    assert f"{sd.STUB_MARKER}[] = STUB_DRIVER_MARKER" in header
    c_dirs = re.findall(r'"(/[^"]+)"', header.split("#define STUB_LIB_DIRS", 1)[1].split("*/")[0])
    assert {f"/{d}" for d in sd.LIB_DIRS.values()} <= set(c_dirs)


def test_no_compiler_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda _name: None)
    with pytest.raises(StubDriverError, match=re.escape(sd.NO_COMPILER)):
        sd.build_stubs(tmp_path)


def test_c_is_clean_and_builds_are_reused(artefacts: Path) -> None:
    for source in sorted(C_DIR.glob("*.c")):
        argv = ["gcc", "-O2", "-fPIC", "-Wall", "-Wextra", "-Werror", "-c", "-o", os.devnull]
        argv.append(str(source))
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr
    assert sd.build_stubs(artefacts.parent) == artefacts
    assert artefacts.name == sd.source_hash()


def test_libraries_export_the_marker_and_the_c_api(root: Path) -> None:
    lib = root / LIB
    script = f"""
import ctypes, json
ml = ctypes.CDLL({str(lib / "libnvidia-ml.so.1")!r})
cu = ctypes.CDLL({str(lib / "libcuda.so.1")!r})
marker = (ctypes.c_char * 64).in_dll(ml, "gpu_operator_stub_driver").value.decode()
n, h, ptr, uuid = ctypes.c_uint(), ctypes.c_void_p(), ctypes.c_ulonglong(), (ctypes.c_char * 16)()
out = dict(marker=marker, init=ml.nvmlInit_v2(),
    count=(ml.nvmlDeviceGetCount_v2(ctypes.byref(n)), n.value),
    bad_index=ml.nvmlDeviceGetHandleByIndex_v2(7, ctypes.byref(h)),
    small_buffer=ml.nvmlSystemGetDriverVersion(ctypes.create_string_buffer(4), 4),
    shutdown=[ml.nvmlShutdown(), ml.nvmlShutdown()],
    after_shutdown=ml.nvmlDeviceGetCount_v2(ctypes.byref(n)),
    before_cuinit=cu.cuDeviceGetCount(ctypes.byref(n)), cuinit=cu.cuInit(0),
    uuid=(cu.cuDeviceGetUuid(uuid, 0), uuid.raw.hex()),
    no_context=cu.cuMemAlloc_v2(ctypes.byref(ptr), 16),
    cu_marker=(ctypes.c_char * 64).in_dll(cu, "gpu_operator_stub_driver").value.decode())
print(json.dumps(out))
"""
    done = run(root, sys.executable, "-c", script, lib=None)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert (got.pop("marker"), got.pop("cu_marker")) == (sd.DRIVER_MARKER, sd.DRIVER_MARKER)
    assert got.pop("uuid") == [0, "000000001111400080000123456789ab"]  # GPU-00000000-1111-...
    nvml = {"init": 0, "count": [0, 3], "bad_index": 2, "small_buffer": 7, "shutdown": [0, 1]}
    cuda = {"after_shutdown": 1, "before_cuinit": 3, "cuinit": 0, "no_context": 201}
    assert got == nvml | cuda


def test_nvidia_smi_lists_the_table_in_nvml_order(root: Path) -> None:
    done = smi(root, "-L")
    assert (done.returncode, done.stdout.splitlines()) == (0, LIST)
    summary = smi(root).stdout.splitlines()
    assert "SIMULATED" in summary[0] and f"Driver Version: {VERSION}" in summary[0]
    assert "CUDA Version: 13.0" in summary[0] and len(summary) == 4
    query = smi(root, "--query-gpu=name,uuid,memory.total,driver_version", "--format=csv,noheader")
    assert query.stdout.splitlines() == [
        f"NVIDIA A100-SXM4-40GB, {GPUS[1].uuid}, 40960 MiB, {VERSION}",
        f"NVIDIA H100 80GB HBM3, {GPUS[2].uuid}, 81559 MiB, {VERSION}",
        f"Tesla T4, {GPUS[0].uuid}, 15360 MiB, {VERSION}",
    ]
    assert smi(root, "--query-gpu=index,bogus", "--format=csv").returncode == 2


def test_device_nodes_decide_what_is_visible(root: Path) -> None:
    (root / "dev/nvidia1").unlink()
    assert smi(root, "-L").stdout.splitlines() == [LIST[0], LIST[2].replace("GPU 2", "GPU 1")]
    for minor in (0, 3):
        (root / f"dev/nvidia{minor}").unlink()
    done = smi(root, "-L")
    assert (done.returncode, done.stdout) == (6, "No devices were found\n")
    assert "CUDA_ERROR_NO_DEVICE (100)" in probe(root).stdout
    (root / "dev/nvidiactl").unlink()
    done = smi(root, "-L")
    assert (done.returncode, done.stdout.strip()) == (9, FAILED)
    assert "Driver Not Loaded" in done.stderr
    done = probe(root)
    assert done.returncode == 1 and "cuInit: CUDA_ERROR_NO_DEVICE (100)" in done.stdout


def test_without_the_library_nvidia_smi_fails(root: Path) -> None:
    done = smi(root, "-L", lib=None)
    assert (done.returncode, done.stdout.strip()) == (9, FAILED)
    assert "libnvidia-ml.so.1" in done.stderr


def test_cuda_probe_allocates_and_checks_memory(root: Path) -> None:
    done = probe(root)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    for line in ("cuInit: ok", "device 0: NVIDIA A100-SXM4-40GB", "check: ok"):
        assert line in lines
    assert "cuMemAlloc 1048576 bytes: ok" in lines and sd.DRIVER_MARKER in lines[0]
    done = run(root, str(root / "usr/bin" / sd.PROBE), "--bytes", str(50 << 30))
    assert "cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY (2)" in done.stdout  # over 40960 MiB


def test_pynvml_reads_the_stub(root: Path) -> None:
    script = (
        "import pynvml as n; n.nvmlInit(); h = n.nvmlDeviceGetHandleByIndex(1)\n"
        "print(n.nvmlDeviceGetCount(), n.nvmlSystemGetDriverVersion(), n.nvmlDeviceGetName(h),"
        " n.nvmlDeviceGetMemoryInfo(h).total >> 20, n.nvmlDeviceGetMinorNumber(h), sep='|')"
    )
    done = run(root, sys.executable, "-c", script)
    assert done.stdout.strip() == f"3|{VERSION}|NVIDIA H100 80GB HBM3|81559|1", done.stderr


def test_the_lookups_nvidia_ctk_makes_are_answered(root: Path) -> None:
    """``nvidia-ctk cdi generate`` (nvml mode) finds each GPU by UUID and reads its PCI id and
    MIG mode: with these the real tool runs on a stub driver root (the README's comparison)."""
    script = "\n".join(
        [
            "import pynvml as n",
            "n.nvmlInit()",
            "h = n.nvmlDeviceGetHandleByUUID(n.nvmlDeviceGetUUID(n.nvmlDeviceGetHandleByIndex(2)))",
            "p = n.nvmlDeviceGetPciInfo_v3(h)",
            "bus_id = p.busId.decode() if isinstance(p.busId, bytes) else p.busId",
            "print(n.nvmlDeviceGetIndex(h), n.nvmlDeviceGetMigMode(h),",
            "      n.nvmlDeviceGetMaxMigDeviceCount(h), bus_id, p.domain, p.bus, sep='|')",
            "try:",
            "    n.nvmlDeviceGetHandleByUUID('GPU-nope')",
            "except n.NVMLError_NotFound:",
            "    print('not found')",
        ]
    )
    done = run(root, sys.executable, "-c", script)
    index, mig, most, bus_id, domain, bus = done.stdout.splitlines()[0].split("|")
    assert (index, mig, most) == ("2", "[0, 0]", "0"), done.stderr
    gpu = next(g for g in GPUS if g.minor == 3)  # NVML's third: by ascending minor
    assert bus_id == gpu.pci_bus_id
    assert [int(domain), int(bus)] == [int(x, 16) for x in gpu.pci_bus_id.split(":")[:2]]
    assert done.stdout.splitlines()[1] == "not found"


def test_sonames_versions_and_laying_out_again(root: Path, artefacts: Path) -> None:
    readelf = shutil.which("readelf")

    def soname(path: Path) -> str | None:
        assert readelf is not None
        out = subprocess.run([readelf, "-d", str(path)], capture_output=True, text=True).stdout
        found = re.search(r"Library soname: \[([^\]]+)\]", out)
        return found.group(1) if found else None

    for lib in sd.LIBRARIES:
        path = root / LIB / lib.file_name(VERSION)
        assert path.is_file() and not path.is_symlink()
        assert (root / LIB / lib.soname_for(VERSION)).resolve() == path.resolve()
        if readelf:
            assert soname(path) == lib.soname_for(VERSION)
    lay_driver(root, artefacts, version="590.10.1")
    assert not list((root / LIB).glob(f"*.so.{VERSION}"))
    assert not (root / "lib/firmware/nvidia" / VERSION).exists()
    assert os.readlink(root / LIB / "libcuda.so.1") == "libcuda.so.590.10.1"
    if readelf:
        gpucomp = root / LIB / "libnvidia-gpucomp.so.590.10.1"
        assert soname(gpucomp) == "libnvidia-gpucomp.so.590.10.1"
    assert "Driver Version: 590.10.1" in smi(root).stdout
    assert "SIMULATED" in (root / "lib/firmware/nvidia/590.10.1/gsp_ga10x.bin").read_text()


def test_gke_layout_finds_its_root(tmp_path: Path, artefacts: Path) -> None:
    if Path("/dev/nvidiactl").exists():
        pytest.skip("this machine has /dev/nvidiactl (a real driver): the stub would use /dev")
    gke = lay_driver(tmp_path / "nvidia", artefacts, style="gke")
    done = run(gke, str(gke / "bin/nvidia-smi"), "-L", lib="lib64")
    assert done.stdout.splitlines() == LIST


def test_remove_undoes_all_but_device_nodes(tmp_path: Path, artefacts: Path) -> None:
    root = tmp_path / "driver"
    created = lay_out(root, version=VERSION, cuda_version=CUDA, gpus=GPUS, artefacts=artefacts)
    assert created[0] == "usr" and (root / "README.SIMULATED").is_file()
    sd.remove(root, created)
    left = sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))
    sim_dir = sd.PROC_DEVICES.rsplit("/", 1)[0]  # its text goes, and its folder with it
    nodes = sorted(p for p in created if p.startswith("dev/") and not p.startswith(sim_dir))
    assert left == (["dev", *nodes] if nodes else [])


def test_probe_needs_only_libc_and_the_driver(tmp_path: Path, artefacts: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("entering a minimal root (chroot) needs root")
    small = lay_driver(tmp_path / "minimal", artefacts)
    ldd = subprocess.run(
        ["ldd", str(small / "usr/bin" / sd.PROBE)], capture_output=True, text=True, check=True
    ).stdout
    libc = re.findall(r"(/\S+) \(0x", ldd)  # libc.so.6 and the dynamic loader
    assert any("libc.so.6" in path for path in libc), ldd
    for path in libc:
        (small / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, small / path.lstrip("/"))

    def enter() -> None:
        os.chroot(small)
        os.chdir("/")

    def inside(*argv: str) -> subprocess.CompletedProcess[str]:
        env = {"LD_LIBRARY_PATH": f"/{LIB}"}
        return subprocess.run(argv, env=env, preexec_fn=enter, capture_output=True, text=True)

    done = inside(f"/usr/bin/{sd.PROBE}", "--bytes", "1048576")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "device 0: NVIDIA A100-SXM4-40GB" in done.stdout
    assert inside("/usr/bin/nvidia-smi", "-L").stdout.splitlines() == LIST
    driver = {e.path for e in sd.plan_layout(version=VERSION, cuda_version=CUDA, gpus=GPUS)}
    extra = {p.relative_to(small).as_posix() for p in small.rglob("*") if not p.is_dir()}
    assert extra - driver == {path.lstrip("/") for path in libc}  # nothing else in there


def test_compute_mode_and_time_slice_are_the_gpus_state_shared_by_every_process(
    root: Path,
) -> None:
    """``nvidia-smi -c`` and ``compute-policy --set-timeslice`` change what the GPU holds, seen
    by the next process (nvidia-smi's query, pynvml, a test's read), one GPU at a time."""
    a100, h100 = GPUS[1].uuid, GPUS[2].uuid
    assert sd.read_compute_policy(root / "dev", a100) == sd.ComputePolicy("Default", "Default")
    done = smi(root, "-i", a100, "-c", "EXCLUSIVE_PROCESS")
    assert done.returncode == 0 and "Exclusive_Process" in done.stdout, done.stdout
    done = smi(root, "compute-policy", "-i", "1", "--set-timeslice", "3")  # index 1: the H100
    assert done.returncode == 0, done.stdout
    modes = smi(root, "--query-gpu=uuid,compute_mode", "--format=csv,noheader").stdout
    assert modes.splitlines() == [
        f"{a100}, Exclusive_Process",
        f"{h100}, Default",
        f"{GPUS[0].uuid}, Default",
    ]
    assert sd.read_compute_policy(root / "dev", a100) == sd.ComputePolicy(
        "Exclusive_Process", "Default"
    )
    assert sd.read_compute_policy(root / "dev", h100) == sd.ComputePolicy("Default", "Long")
    script = (
        "import pynvml as n; n.nvmlInit()\n"
        f"h = n.nvmlDeviceGetHandleByUUID({a100!r}); print(n.nvmlDeviceGetComputeMode(h))\n"
        "n.nvmlDeviceSetComputeMode(h, n.NVML_COMPUTEMODE_DEFAULT); print('reset')"
    )
    done = run(root, sys.executable, "-c", script)
    assert done.stdout.split() == ["3", "reset"], done.stderr
    assert sd.read_compute_policy(root / "dev", a100) == sd.ComputePolicy()
    # Bad values change nothing and say why.
    for args in (("compute-policy", "-i", "1", "--set-timeslice", "4"), ("-i", "0", "-c", "bogus")):
        done = smi(root, *args)
        assert done.returncode == 2, (args, done.stdout)
    assert smi(root, "-i", "GPU-nope", "-c", "0").returncode == 6
    assert sd.read_compute_policy(root / "dev", h100).time_slice == "Long"


def simulated_node(
    root: Path, artefacts: Path, monkeypatch: pytest.MonkeyPatch, spec: str, seed: str
) -> None:
    """A simulated node's stub driver at ``root`` (its device nodes stand-ins when not root)
    and this process's NVML the agents' simulated one over its state, as on that node."""
    from gpu_operator.sim.nvml import SIM_STATE, install_simulated_nvml
    from gpu_operator.sim.operands import install_driver

    if Path("/dev/nvidiactl").exists():
        pytest.skip("this machine has /dev/nvidiactl (a real driver): the stub would use /dev")
    monkeypatch.setenv("GPU_OPERATOR_STUB_ARTEFACTS", str(artefacts))
    installed = install_driver(spec, root, seed=seed)
    table = sd.read_table(next((root / LIB).glob("libnvidia-ml.so.*.*")))
    for entry in sd.plan_layout(
        version=installed["driver_version"], cuda_version=table.cuda_version, gpus=table.gpus
    ):
        if entry.kind == "node" and not (root / entry.path).exists():  # not root: stand-ins
            (root / entry.path).parent.mkdir(exist_ok=True)
            (root / entry.path).touch()
    install_simulated_nvml(spec, seed=seed, state_file=root / "dev" / SIM_STATE)


def test_an_agents_simulated_nvml_and_the_stubs_c_library_share_the_compute_mode(
    tmp_path: Path, artefacts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a simulated node's stub driver, an agent's NVML (the Python simulation) and the
    stub's C programs keep one compute mode per GPU: set by one, read by the other."""
    import pynvml

    from gpu_operator.sim.nvml import uninstall_simulated_nvml

    root = tmp_path / "driver"
    simulated_node(root, artefacts, monkeypatch, "a100-40gb:2", "node-x")
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(1)
        uuid = pynvml.nvmlDeviceGetUUID(handle)
        assert pynvml.nvmlDeviceGetComputeMode(handle) == pynvml.NVML_COMPUTEMODE_DEFAULT
        pynvml.nvmlDeviceSetComputeMode(handle, pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)
        modes = smi(root, "--query-gpu=uuid,compute_mode", "--format=csv,noheader").stdout
        assert f"{uuid}, Exclusive_Process" in modes.splitlines(), modes
        assert smi(root, "-i", uuid, "-c", "PROHIBITED").returncode == 0
        assert pynvml.nvmlDeviceGetComputeMode(handle) == pynvml.NVML_COMPUTEMODE_PROHIBITED
        other = pynvml.nvmlDeviceGetHandleByIndex(0)
        assert pynvml.nvmlDeviceGetComputeMode(other) == pynvml.NVML_COMPUTEMODE_DEFAULT
        pynvml.nvmlShutdown()
    finally:
        uninstall_simulated_nvml()


def test_the_mps_control_daemon_holds_the_limits_it_is_given_until_it_quits(
    root: Path, tmp_path: Path
) -> None:
    """``nvidia-cuda-mps-control -d`` returns once it listens on the pipe directory; a client
    sets and reads its defaults (a device by UUID or by index into CUDA_VISIBLE_DEVICES) and
    the host reads them too; bad values are refused; ``quit`` takes the socket away."""
    control = str(root / "usr/bin/nvidia-cuda-mps-control")
    pipe, logs = tmp_path / "pipe", tmp_path / "log"
    a100, h100 = GPUS[1].uuid, GPUS[2].uuid
    env = {
        **os.environ,
        "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
        "CUDA_MPS_LOG_DIRECTORY": str(logs),
        "CUDA_VISIBLE_DEVICES": f"{a100},{h100}",
    }

    def client(*lines: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [control], input="".join(f"{line}\n" for line in lines), env=env,
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip

    assert client("get_default_active_thread_percentage").returncode == 1  # no daemon yet
    assert subprocess.run([control, "-d"], env=env, timeout=30, check=False).returncode == 0
    try:
        assert (pipe / "control").is_socket()
        assert (pipe / "control").stat().st_mode & 0o777 == 0o666  # any user's client connects
        assert subprocess.run([control, "-d"], env=env, timeout=30, check=False).returncode == 1
        done = client(
            "set_default_active_thread_percentage 50",
            "set_default_device_pinned_mem_limit 0 10240M",
            f"set_default_device_pinned_mem_limit {h100} 2G",
            "set_default_active_thread_percentage 150",
            "set_default_device_pinned_mem_limit 2 1G",
            "get_default_active_thread_percentage",
            f"get_default_device_pinned_mem_limit {a100}",
        )
        assert done.stdout.splitlines() == [
            "50.0",
            "Invalid active thread percentage 150",
            "Invalid device or limit: 2 1G",
            "50.0",
            "10240M",
        ], done.stdout
        state = sd.read_mps_state(pipe)
        assert state is not None and state.thread_percentage == "50.0"
        assert state.pinned_limits == {a100: "10240M", h100: "2G"}
        assert "SIMULATED" in (logs / "control.log").read_text()
    finally:
        client("quit")
    assert not (pipe / "control").exists() and sd.read_mps_state(pipe) is None
    server = subprocess.run(
        [str(root / "usr/bin/nvidia-cuda-mps-server")], capture_output=True, text=True, check=False
    )
    assert server.returncode == 1 and "SIMULATED" in server.stderr


def test_nvidia_smi_lists_the_mig_devices_the_simulated_nvml_made_that_this_process_may_use(
    tmp_path: Path, artefacts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent's NVML creates a MIG device; the stub's ``nvidia-smi -L`` lists it under its GPU
    while both its capability nodes are there (a container given it through CDI), and not once
    one is missing or the device is destroyed."""
    from gpu_operator.agent.driverroot import mig_device_caps, parse_mig_minors
    from gpu_operator.agent.driverroot.devices import mig_minors_text
    from gpu_operator.agent.nvml import Nvml
    from gpu_operator.sim.nvml import uninstall_simulated_nvml

    root = tmp_path / "driver"
    simulated_node(root, artefacts, monkeypatch, "h100-80gb:1", "node-m")
    try:
        with Nvml() as nvml:
            gpu = nvml.inventory().gpus[0]
            assert smi(root, "-L").stdout.splitlines() == [f"GPU 0: {gpu.name} (UUID: {gpu.uuid})"]
            nvml.set_mig_mode(0, True)
            profile = next(p for p in gpu.mig_profiles if p.name == "3g.40gb")
            gi = nvml.create_gpu_instance(0, profile.index, profile.placements[1])
            ci = nvml.create_compute_instance(0, gi, profile.slice_count)
            (mig,) = nvml.gpu(0).mig_devices
            listed = smi(root, "-L").stdout.splitlines()
            assert listed == [
                f"GPU 0: {gpu.name} (UUID: {gpu.uuid})",
                f"  MIG 3g.40gb     Device  0: (UUID: {mig.uuid})",
            ]
            _, ci_cap = mig_device_caps(parse_mig_minors(mig_minors_text(1)), 0, gi, ci)
            (root / ci_cap.lstrip("/")).unlink()  # a process not given this MIG device
            assert len(smi(root, "-L").stdout.splitlines()) == 1
            (root / ci_cap.lstrip("/")).touch()
            nvml.destroy_gpu_instance(0, gi)
            assert len(smi(root, "-L").stdout.splitlines()) == 1
    finally:
        uninstall_simulated_nvml()


def test_the_pci_bus_is_laid_out_beside_the_driver_when_asked(
    tmp_path: Path, artefacts: Path
) -> None:
    from gpu_operator.agent.dra.vfio import NVIDIA_DRIVER, pci_bus

    root = tmp_path / "driver"
    created = lay_out(
        root, version=VERSION, cuda_version=CUDA, gpus=GPUS, artefacts=artefacts, pci=True
    )
    assert "sys/bus/pci/devices/0000:0a:00.0/device" in created
    bus = pci_bus(root)
    assert bus.nvidia_functions() == ["0000:07:00.0", "0000:08:00.0", "0000:0a:00.0"]
    ids = [
        (root / "sys/bus/pci/devices" / a / "device").read_text() for a in bus.nvidia_functions()
    ]
    assert ids == ["0x20b0\n", "0x2330\n", "0x1eb8\n"]  # A100-SXM4-40GB, H100, T4
    assert {bus.driver_of(a) for a in bus.nvidia_functions()} == {NVIDIA_DRIVER}
