"""Driver roots as nvidia-ctk sees them: real (tiny) ELF libraries, glibc ld.so.cache files,
the layouts of Ubuntu, RHEL, the driver container and GKE, device nodes and MIG minors."""

from __future__ import annotations

import os
import pickle
import socket
import stat
from pathlib import Path

import pytest

from gpu_operator.agent.driverroot import (
    DriverNotFound,
    Library,
    device_nodes,
    discover_driver,
    find_library,
    mig_device_caps,
    mig_minors_text,
    parse_mig_minors,
)
from gpu_operator.agent.driverroot.elf import ElfInfo, read_elf
from gpu_operator.agent.driverroot.ldcache import CacheEntry, parse_ld_cache, read_ld_cache
from gpu_operator.agent.driverroot.rootfs import resolve

from .driver_layouts import (
    CACHE_HOST,
    CACHE_I386,
    EM_386,
    FOREIGN,
    HOST,
    VERSION,
    driver_libs,
    elf_bytes,
    executable,
    gke,
    ld_cache,
    ld_cache_bytes,
    lib,
    link,
    rhel,
    script,
    ubuntu,
    write,
)

MULTIARCH = "/usr/lib/x86_64-linux-gnu"


def driver_libraries(libdir: str) -> tuple[Library, ...]:
    """What driver_libs() writes, as discover_driver reports it."""
    return tuple(
        sorted(
            [
                Library(f"{libdir}/libcuda.so.{VERSION}", "libcuda.so.1"),
                Library(
                    f"{libdir}/libnvidia-gpucomp.so.{VERSION}", f"libnvidia-gpucomp.so.{VERSION}"
                ),
                Library(f"{libdir}/libnvidia-ml.so.{VERSION}", "libnvidia-ml.so.1"),
                Library(f"{libdir}/libnvidia-nvvm70.so.4", "libnvidia-nvvm70.so.4"),
                Library(f"{libdir}/vdpau/libvdpau_nvidia.so.{VERSION}", "libvdpau_nvidia.so.1"),
            ],
            key=lambda library: library.path,
        )
    )


# --- ELF ---------------------------------------------------------------------------------


def test_elf_reads_class_machine_and_soname(tmp_path: Path) -> None:
    lib(tmp_path, "a.so", "libcuda.so.1")
    lib(tmp_path, "b.so", "libcuda.so.1", bits=32)
    lib(tmp_path, "c.so", None)
    lib(tmp_path, "d.so", "libx.so.1", machine=FOREIGN)
    assert read_elf(tmp_path / "a.so") == ElfInfo(64, HOST, "libcuda.so.1")
    assert read_elf(tmp_path / "b.so") == ElfInfo(32, EM_386, "libcuda.so.1")
    assert read_elf(tmp_path / "c.so") == ElfInfo(64, HOST, None)
    assert read_elf(tmp_path / "d.so") == ElfInfo(64, FOREIGN, "libx.so.1")


def test_elf_tolerates_garbage(tmp_path: Path) -> None:
    good = elf_bytes("libcuda.so.1")
    cases = {
        "text": b"INPUT(-lfoo)\n",  # a linker script named like a library
        "empty": b"",
        "magic-only": b"\x7fELF",
        "truncated": good[:100],  # program headers cut off
        "no-strings": good[: len(good) - 14],  # soname runs off the end of the file
        "bad-class": good[:4] + b"\x07" + good[5:],
    }
    for name, data in cases.items():
        write(tmp_path, name, data)
    results = {name: read_elf(tmp_path / name) for name in cases}
    assert results["text"] is None and results["empty"] is None
    assert results["magic-only"] is None and results["bad-class"] is None
    assert results["truncated"] == ElfInfo(64, HOST, None)
    assert results["no-strings"] == ElfInfo(64, HOST, None)
    assert read_elf(tmp_path / "missing") is None
    assert read_elf(tmp_path) is None  # a directory


def test_elf_reads_real_system_libraries() -> None:
    libc = Path("/lib/x86_64-linux-gnu/libc.so.6")
    if HOST != 62 or not libc.exists():
        pytest.skip("needs an x86_64 Debian/Ubuntu libc at /lib/x86_64-linux-gnu")
    assert read_elf(libc) == ElfInfo(64, 62, "libc.so.6")


# --- ld.so.cache -------------------------------------------------------------------------


@pytest.mark.parametrize("old_format", [False, True], ids=["new", "old+new"])
def test_ld_cache_entries(old_format: bool) -> None:
    data = ld_cache_bytes(
        [
            ("libcuda.so.1", "/usr/lib64/libcuda.so.1", CACHE_HOST),
            ("libcuda.so.1", "/usr/lib/libcuda.so.1", CACHE_I386),
            ("libnvidia-ml.so.1", "/usr/lib64/libnvidia-ml.so.1", 0x0A03),
            ("libx32.so.1", "/usr/libx32/libx32.so.1", 0x0803),
        ],
        old_format,
    )
    assert parse_ld_cache(data) == (
        CacheEntry("libcuda.so.1", "/usr/lib64/libcuda.so.1", True),
        CacheEntry("libcuda.so.1", "/usr/lib/libcuda.so.1", False),
        CacheEntry("libnvidia-ml.so.1", "/usr/lib64/libnvidia-ml.so.1", True),
        CacheEntry("libx32.so.1", "/usr/libx32/libx32.so.1", False),
    )


def test_ld_cache_rejects_garbage(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"not a glibc ld\.so\.cache"):
        parse_ld_cache(b"ld.so-1.7.0\0" + bytes(64))
    truncated = ld_cache_bytes([("libc.so.6", "/lib/libc.so.6", CACHE_HOST)])[:60]
    with pytest.raises(ValueError, match="truncated"):
        parse_ld_cache(truncated)
    write(tmp_path, "cache", b"garbage")
    assert read_ld_cache(tmp_path / "cache") == ()
    assert read_ld_cache(tmp_path / "missing") == ()


def test_ld_cache_of_this_machine() -> None:
    if not Path("/etc/ld.so.cache").exists():
        pytest.skip("this machine has no /etc/ld.so.cache")
    entries = parse_ld_cache(Path("/etc/ld.so.cache").read_bytes())
    assert entries, "glibc's cache lists at least libc"
    libc = [e for e in entries if e.soname == "libc.so.6" and e.is_64bit]
    assert libc and all(Path(e.path).exists() for e in libc)
    assert read_elf(find_library("/", "libc.so.6")) == ElfInfo(64, HOST, "libc.so.6")


# --- the root's own paths ----------------------------------------------------------------


def test_symlinks_are_followed_inside_the_root(tmp_path: Path) -> None:
    write(tmp_path, "/usr/lib64/real.so")
    link(tmp_path, "/lib64", "/usr/lib64")  # absolute: the root's /usr/lib64, not ours
    link(tmp_path, "/usr/lib64/abs.so", "/lib64/real.so")
    link(tmp_path, "/usr/lib64/up.so", "../../../../../usr/lib64/real.so")  # .. stops at root
    link(tmp_path, "/loop", "/loop")
    assert resolve(str(tmp_path), "/lib64/abs.so") == "/usr/lib64/real.so"
    assert resolve(str(tmp_path), "/usr/lib64/up.so") == "/usr/lib64/real.so"
    assert resolve(str(tmp_path), "/loop") is None
    assert resolve(str(tmp_path), "/lib64/missing.so") is None
    assert resolve("/", "/") == "/"


# --- discovery ---------------------------------------------------------------------------


def test_ubuntu_multiarch(tmp_path: Path) -> None:
    ubuntu(tmp_path)
    files = discover_driver(tmp_path)
    assert files.root == str(tmp_path)
    assert files.version == VERSION
    assert files.library_dir == MULTIARCH
    assert files.libraries == driver_libraries(MULTIARCH)
    assert files.binaries == (
        "/usr/bin/nvidia-smi",
        "/usr/bin/nvidia-debugdump",
        "/usr/bin/nvidia-persistenced",
    )
    assert files.firmware == (
        f"/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin",
        f"/lib/firmware/nvidia/{VERSION}/gsp_tu10x.bin",
    )
    assert files.ipc == () and files.hook is None
    cuda = files.library("libcuda.so.1")
    assert cuda is not None and cuda.path == f"{MULTIARCH}/libcuda.so.{VERSION}"
    assert files.library("libnvidia-gpucomp.so.1") is None
    assert files.host_path(cuda.path) == str(tmp_path) + cuda.path
    # searched: the library dirs up to the one that held libcuda, then the rest of the lookups
    assert files.searched[:3] == (str(tmp_path), f"{tmp_path}/usr/lib64", f"{tmp_path}{MULTIARCH}")
    for place in (
        "/usr/bin",
        "/sbin",
        f"/lib/firmware/nvidia/{VERSION}",
        "/var/run/nvidia-persistenced/socket",
        "/tmp/nvidia-mps",
        "/usr/local/nvidia/toolkit",
        f"{MULTIARCH}/vdpau",
    ):
        assert f"{tmp_path}{place}" in files.searched


def test_rhel_lib64_skips_32bit_libraries(tmp_path: Path) -> None:
    rhel(tmp_path)
    files = discover_driver(tmp_path)
    assert files.library_dir == "/usr/lib64"
    assert files.libraries == driver_libraries("/usr/lib64")
    assert files.binaries == ("/usr/bin/nvidia-smi",)


def test_32bit_and_foreign_libraries_are_never_the_driver(tmp_path: Path) -> None:
    lib(tmp_path, f"/usr/lib64/libcuda.so.{VERSION}", "libcuda.so.1", bits=32)
    lib(tmp_path, f"/usr/lib/libnvidia-ml.so.{VERSION}", "libnvidia-ml.so.1", machine=FOREIGN)
    with pytest.raises(DriverNotFound) as caught:
        discover_driver(tmp_path)
    message = str(caught.value)
    assert "skipped (not 64-bit" in message
    assert f"{tmp_path}/usr/lib64/libcuda.so.{VERSION}" in message
    assert f"{tmp_path}/usr/lib/libnvidia-ml.so.{VERSION}" in message


def test_library_dir_mixes_are_filtered(tmp_path: Path) -> None:
    """A 32-bit or foreign-machine file with the driver's version is left out; a non-ELF one
    (a simulated node's placeholder) is kept, without a soname."""
    driver_libs(tmp_path, "/usr/lib64")
    lib(tmp_path, f"/usr/lib64/libnvidia-old32.so.{VERSION}", "libnvidia-old32.so.1", bits=32)
    lib(tmp_path, f"/usr/lib64/libnvidia-arm.so.{VERSION}", "libnvidia-arm.so.1", machine=FOREIGN)
    write(tmp_path, f"/usr/lib64/libnvidia-placeholder.so.{VERSION}", b"simulated")
    files = discover_driver(tmp_path)
    paths = {library.path: library.soname for library in files.libraries}
    assert f"/usr/lib64/libnvidia-old32.so.{VERSION}" not in paths
    assert f"/usr/lib64/libnvidia-arm.so.{VERSION}" not in paths
    assert paths[f"/usr/lib64/libnvidia-placeholder.so.{VERSION}"] is None


def test_driver_container_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """/run/nvidia/driver: a whole distribution tree whose links are absolute for *that* root
    (merged /usr, alternatives), with the daemons' sockets and the CDI hook inside it."""
    root = tmp_path / "run/nvidia/driver"
    driver_libs(root, "/usr/lib/x86_64-linux-gnu", absolute=True)
    link(root, "/lib", "usr/lib")
    link(root, "/bin", "/usr/bin")
    link(root, "/var/run", "/run")
    executable(root, "/usr/bin/nvidia-smi")
    executable(root, "/usr/lib/nvidia/nvidia-persistenced")
    link(root, "/usr/bin/nvidia-persistenced", "/usr/lib/nvidia/nvidia-persistenced")
    executable(root, "/usr/local/nvidia/toolkit/nvidia-cdi-hook")
    executable(root, "/usr/bin/nvidia-ctk")
    write(root, f"/usr/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin", b"gsp")
    (root / "tmp/nvidia-mps").mkdir(parents=True)
    (root / "run/nvidia-persistenced").mkdir(parents=True)
    monkeypatch.chdir(root / "run/nvidia-persistenced")  # a unix socket's path is short
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind("socket")
        files = discover_driver(str(root))
    finally:
        server.close()
    assert stat.S_ISSOCK(os.lstat(root / "run/nvidia-persistenced/socket").st_mode)
    assert files.root == str(root)
    assert files.library_dir == MULTIARCH
    assert files.libraries == driver_libraries(MULTIARCH)
    assert files.binaries == ("/usr/bin/nvidia-smi", "/usr/bin/nvidia-persistenced")
    # /lib/firmware and /usr/lib/firmware are one directory here: listed once
    assert files.firmware == (f"/usr/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin",)
    assert files.ipc == ("/run/nvidia-persistenced/socket", "/tmp/nvidia-mps")
    assert files.hook == "/usr/local/nvidia/toolkit/nvidia-cdi-hook"
    assert files.host_path(files.ipc[0]) == f"{root}/run/nvidia-persistenced/socket"
    assert all(p.startswith(str(root)) for p in files.searched)


def test_gke_layout(tmp_path: Path) -> None:
    root = tmp_path / "home/kubernetes/bin/nvidia"
    gke(root)
    files = discover_driver(root)
    assert files.library_dir == "/lib64"
    assert files.libraries == driver_libraries("/lib64")
    assert files.binaries == ("/bin/nvidia-smi", "/bin/nvidia-cuda-mps-control")
    assert files.host_path("/bin/nvidia-smi") == f"{root}/bin/nvidia-smi"


def test_a_driver_under_one_prefix_beside_a_wrapper_script(tmp_path: Path) -> None:
    """Seen on a GPU machine: the driver under /usr/local/nvidia (lib64, bin, firmware) and a
    shell script /usr/bin/nvidia-smi that execs the real one. The spec must carry the ELF
    program (a container has no shell and no /usr/local/nvidia), and the firmware beside it."""
    driver_libs(tmp_path, "/usr/local/nvidia/lib64")
    ld_cache(tmp_path, [("libcuda.so.1", "/usr/local/nvidia/lib64/libcuda.so.1", CACHE_HOST)])
    script(tmp_path, "/usr/bin/nvidia-smi")
    executable(tmp_path, "/usr/local/nvidia/bin/nvidia-smi")
    gsp = write(tmp_path, f"/usr/local/nvidia/firmware/nvidia/{VERSION}/gsp_ga10x.bin")
    files = discover_driver(tmp_path)
    assert files.library_dir == "/usr/local/nvidia/lib64"
    assert files.binaries == ("/usr/local/nvidia/bin/nvidia-smi",)
    assert files.firmware == (f"/usr/local/nvidia/firmware/nvidia/{VERSION}/gsp_ga10x.bin",)
    assert gsp.exists()


def test_library_only_in_the_roots_ld_cache(tmp_path: Path) -> None:
    """A driver in a directory no one searches is still found through the root's own cache,
    whose paths are inside the root."""
    driver_libs(tmp_path, "/opt/nvidia/lib")
    ld_cache(
        tmp_path,
        [
            ("libcuda.so.1", "/opt/nvidia/lib/libcuda.so.1", CACHE_I386),  # 32-bit: ignored
            ("libcuda.so.1", "/opt/nvidia/lib/libcuda.so.1", CACHE_HOST),
            ("libnvidia-ml.so.1", "/opt/nvidia/lib/libnvidia-ml.so.1", CACHE_HOST),
        ],
    )
    files = discover_driver(tmp_path)
    assert files.version == VERSION
    assert files.library_dir == "/opt/nvidia/lib"
    assert files.libraries == driver_libraries("/opt/nvidia/lib")
    assert f"{tmp_path}/etc/ld.so.cache" in files.searched


def test_missing_libcuda_takes_the_version_from_nvml(tmp_path: Path) -> None:
    lib(tmp_path, f"/usr/lib64/libnvidia-ml.so.{VERSION}", "libnvidia-ml.so.1")
    link(tmp_path, "/usr/lib64/libnvidia-ml.so.1", f"libnvidia-ml.so.{VERSION}")
    files = discover_driver(tmp_path)
    assert files.version == VERSION
    assert files.library("libcuda.so.1") is None
    assert files.libraries == (
        Library(f"/usr/lib64/libnvidia-ml.so.{VERSION}", "libnvidia-ml.so.1"),
    )
    assert not any("libcuda" in library.path for library in files.libraries)


def test_soname_link_chooses_among_versions(tmp_path: Path) -> None:
    """An upgrade can leave the old driver's file; libcuda.so.1 says which one is in use."""
    driver_libs(tmp_path, "/usr/lib64", version="535.104.05")
    lib(tmp_path, "/usr/lib64/libcuda.so.550.54.15", "libcuda.so.1")
    assert discover_driver(tmp_path).version == "535.104.05"
    os.unlink(tmp_path / "usr/lib64/libcuda.so.1")
    assert discover_driver(tmp_path).version == "550.54.15"  # else the highest


def test_nothing_there(tmp_path: Path) -> None:
    (tmp_path / "usr/lib64").mkdir(parents=True)
    with pytest.raises(DriverNotFound) as caught:
        discover_driver(tmp_path)
    error = caught.value
    assert error.root == str(tmp_path)
    message = str(error)
    assert message.startswith("libcuda.so.<version> or libnvidia-ml.so.<version> (64-bit")
    assert f"under driver root {tmp_path};" in message
    for place in ("/usr/lib64", MULTIARCH, "/glibc/lib", "/lib", "/etc/ld.so.cache"):
        assert f"{tmp_path}{place}" in error.searched
        assert f"{tmp_path}{place}" in message
    assert not any("*" in place for place in error.searched)
    assert pickle.loads(pickle.dumps(error)).args == error.args
    missing = tmp_path / "absent"
    with pytest.raises(DriverNotFound, match="which does not exist"):
        discover_driver(missing)


# --- find_library ------------------------------------------------------------------------


def test_find_library_through_a_soname_link(tmp_path: Path) -> None:
    driver_libs(tmp_path, MULTIARCH, absolute=True)  # libnvidia-ml.so.1 -> /usr/lib/... (root's)
    found = find_library(tmp_path, "libnvidia-ml.so.1")
    assert found == tmp_path / f"usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{VERSION}"
    assert read_elf(found) == ElfInfo(64, HOST, "libnvidia-ml.so.1")


def test_find_library_asks_the_cache_first(tmp_path: Path) -> None:
    driver_libs(tmp_path, "/usr/lib64")
    driver_libs(tmp_path, "/opt/nvidia/lib", version="550.54.15")
    ld_cache(
        tmp_path, [("libnvidia-ml.so.1", "/opt/nvidia/lib/libnvidia-ml.so.1", CACHE_HOST)], old=True
    )
    assert (
        find_library(str(tmp_path), "libnvidia-ml.so.1")
        == tmp_path / "opt/nvidia/lib/libnvidia-ml.so.550.54.15"
    )


def test_find_library_names_what_it_searched(tmp_path: Path) -> None:
    lib(tmp_path, "/usr/lib/libnvidia-ml.so.1", "libnvidia-ml.so.1", bits=32)
    with pytest.raises(DriverNotFound) as caught:
        find_library(tmp_path, "libnvidia-ml.so.1")
    message = str(caught.value)
    assert message.startswith("libnvidia-ml.so.1 (64-bit")
    assert f"{tmp_path}/etc/ld.so.cache, {tmp_path}, {tmp_path}/usr/lib64" in message
    assert "skipped (not 64-bit" in message and f"{tmp_path}/usr/lib/libnvidia-ml.so.1" in message


# --- device nodes ------------------------------------------------------------------------


def mknod(root: Path, path: str, major: int, minor: int) -> None:
    where = root / path.lstrip("/")
    where.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mknod(where, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
    except PermissionError:
        pytest.skip("creating character devices needs root (CAP_MKNOD); not available here")


def test_device_nodes(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("creating character devices needs root (CAP_MKNOD)")
    for minor in (0, 1, 7):
        mknod(tmp_path, f"/dev/nvidia{minor}", 195, minor)
    mknod(tmp_path, "/dev/nvidiactl", 195, 255)
    mknod(tmp_path, "/dev/nvidia-uvm", 511, 0)
    mknod(tmp_path, "/dev/nvidia-caps/nvidia-cap1", 508, 1)
    mknod(tmp_path, "/dev/nvidia-caps/nvidia-cap12", 508, 12)
    mknod(tmp_path, "/dev/nvidia-caps/nvidia-cap2", 508, 2)
    # stand-ins a careless simulator might leave: files are not device nodes
    write(tmp_path, "/dev/nvidia3", b"")
    write(tmp_path, "/dev/nvidia-uvm-tools", b"")
    write(tmp_path, "/dev/nvidia-caps/nvidia-cap3", b"")
    mknod(tmp_path, "/dev/nvidia-nvswitch0", 195, 0)  # not a GPU
    nodes = device_nodes(tmp_path)
    assert dict(nodes.gpus) == {0: "/dev/nvidia0", 1: "/dev/nvidia1", 7: "/dev/nvidia7"}
    assert list(nodes.gpus) == [0, 1, 7]
    assert nodes.control == ("/dev/nvidiactl", "/dev/nvidia-uvm")
    assert nodes.caps == (
        "/dev/nvidia-caps/nvidia-cap1",
        "/dev/nvidia-caps/nvidia-cap2",
        "/dev/nvidia-caps/nvidia-cap12",
    )
    assert nodes.host_path("/dev/nvidia0") == f"{tmp_path}/dev/nvidia0"


def test_regular_files_are_not_device_nodes(tmp_path: Path) -> None:
    for path in ("/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-caps/nvidia-cap1"):
        write(tmp_path, path, b"")
    nodes = device_nodes(tmp_path)
    assert (dict(nodes.gpus), nodes.control, nodes.caps) == ({}, (), ())
    empty = device_nodes(tmp_path / "absent")
    assert (dict(empty.gpus), empty.control, empty.caps) == ({}, (), ())
    assert device_nodes("/").host_path("/dev/nvidia0") == "/dev/nvidia0"


# --- MIG capability minors ---------------------------------------------------------------

KERNEL_SAMPLE = """\
config 1
monitor 2
gpu0/gi0/access 3
gpu0/gi0/ci0/access 4
gpu0/gi0/ci1/access 5
gpu0/gi1/access 12
gpu0/gi1/ci0/access 13

not a line
gpu1/gi0/access 138
"""


def test_parse_mig_minors() -> None:
    assert parse_mig_minors(KERNEL_SAMPLE) == {
        "config": 1,
        "monitor": 2,
        "gpu0/gi0/access": 3,
        "gpu0/gi0/ci0/access": 4,
        "gpu0/gi0/ci1/access": 5,
        "gpu0/gi1/access": 12,
        "gpu0/gi1/ci0/access": 13,
        "gpu1/gi0/access": 138,
    }


def test_mig_minors_text_is_the_kernels_table() -> None:
    text = mig_minors_text(2)
    lines = text.splitlines()
    assert lines[:5] == [
        "config 1",
        "monitor 2",
        "gpu0/gi0/access 3",
        "gpu0/gi0/ci0/access 4",
        "gpu0/gi0/ci1/access 5",
    ]
    assert len(lines) == 2 + 2 * 15 * 9 and text.endswith("\n")
    minors = parse_mig_minors(text)
    assert minors == parse_mig_minors(KERNEL_SAMPLE) | minors  # agrees with the sample
    assert minors["gpu1/gi14/ci7/access"] == 272
    # values quoted from a real node's file in NVIDIA's k8s-dra-driver-gpu (deviceinfo.go)
    full = parse_mig_minors(mig_minors_text(32))
    assert full["gpu3/gi3/ci3/access"] == 439
    assert full["gpu6/gi11/ci5/access"] == 918
    assert full["gpu6/gi11/ci7/access"] == 920
    assert max(full.values()) == 3 + 32 * 135 - 1
    assert sorted(full.values()) == list(range(1, 3 + 32 * 135))
    assert mig_minors_text(0) == "config 1\nmonitor 2\n"
    with pytest.raises(ValueError):
        mig_minors_text(33)


def test_mig_device_caps() -> None:
    minors = parse_mig_minors(mig_minors_text(8))
    assert mig_device_caps(minors, 0, 1, 0) == (
        "/dev/nvidia-caps/nvidia-cap12",
        "/dev/nvidia-caps/nvidia-cap13",
    )
    assert mig_device_caps(minors, 6, 11, 5) == (
        "/dev/nvidia-caps/nvidia-cap912",
        "/dev/nvidia-caps/nvidia-cap918",
    )
    with pytest.raises(KeyError, match="gpu8/gi0/access"):
        mig_device_caps(minors, 8, 0, 0)


def test_proc_devices_gives_character_majors_and_imex_channel_paths() -> None:
    from gpu_operator.agent.driverroot import IMEX_CHANNELS_DEVICE, char_device_majors
    from gpu_operator.agent.driverroot.devices import imex_channel_path

    text = (
        "Character devices:\n  1 mem\n195 nvidia-frontend\n234 nvidia-caps-imex-channels\n"
        "236 nvidia-caps\n511 nvidia-uvm\n\nBlock devices:\n  7 loop\n259 blkext\n"
    )
    majors = char_device_majors(text)
    assert majors[IMEX_CHANNELS_DEVICE] == 234
    assert majors["nvidia-frontend"] == 195 and "loop" not in majors
    assert char_device_majors("Character devices:\n195 nvidia-frontend\n") == {
        "nvidia-frontend": 195
    }
    assert imex_channel_path(5) == "/dev/nvidia-caps-imex-channels/channel5"
