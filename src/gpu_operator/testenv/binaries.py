"""Where the control-plane binaries live, and how to get them built.

`hack/build-components.sh` is the single source of truth for versions and the cache layout; this
module mirrors its defaults (reading them from the script when the repository is at hand) so that
a cached build is found without Go installed and without running the script.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

# The control plane's processes; the same bin dir also holds the real nodes' kubelet/kube-proxy.
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
# helm is built there too, for the chart's tests; no cluster runs it.
BUILT = (*COMPONENTS, "kubelet", "kube-proxy", "helm")
# What `build-components.sh nodes` puts in the node dir: bin/ and images/<kind>.oci.tar.
NODE_BINARIES = ("containerd", "containerd-shim-runc-v2", "ctr", "pause", "incluster-get")
NODE_IMAGES = ("pause", "shell")

# Fallbacks for when the package runs outside a checkout; keep in step with the script.
_DEFAULT_VERSIONS = {
    "K8S_VERSION": "v1.37.2",
    "ETCD_VERSION": "v3.6.16",
    "KWOK_VERSION": "v0.7.0",
    "CONTAINERD_VERSION": "v2.4.2",
    "NODE_IMAGES_VERSION": "1",
}


def in_ci() -> bool:
    """CI is set: what would be skipped elsewhere (no Go, no root for real nodes) fails."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


class BinariesError(RuntimeError):
    """The binaries are missing and cannot be built here (reason in the message)."""


def repo_root() -> Path | None:
    """The checkout holding `hack/build-components.sh`: from $TESTENV_REPO_ROOT, cwd or here."""
    env = os.environ.get("TESTENV_REPO_ROOT")
    starts = [Path(env)] if env else []
    starts += [Path.cwd(), Path(__file__).resolve()]
    for start in starts:
        for candidate in (start, *start.parents):
            if (candidate / "hack" / "build-components.sh").is_file():
                return candidate
    return None


def build_script() -> Path | None:
    root = repo_root()
    return root / "hack" / "build-components.sh" if root else None


def versions(release: str | None = None) -> dict[str, str]:
    """Pinned versions: environment overrides, else the script's defaults, else ours;
    ``release`` (``v1.33.13``) names the Kubernetes release over all of them."""
    found = dict(_DEFAULT_VERSIONS)
    script = build_script()
    if script is not None:
        text = script.read_text()
        for key in found:
            match = re.search(rf"^{key}=\$\{{{key}:-([^}}]+)\}}", text, re.MULTILINE)
            if match:
                found[key] = match.group(1)
    for key in found:
        found[key] = os.environ.get(key, found[key])
    if release is not None:
        found["K8S_VERSION"] = release
    return found


def _cache_root() -> Path:
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(os.environ.get("TESTENV_CACHE") or Path(xdg) / "gpu-operator-testenv")


def cache_bin_dir(release: str | None = None) -> Path:
    """The versioned cache directory the build script writes to (for ``release``: that
    Kubernetes release's)."""
    v = versions(release)
    key = f"k8s-{v['K8S_VERSION']}_etcd-{v['ETCD_VERSION']}_kwok-{v['KWOK_VERSION']}"
    return _cache_root() / key / "bin"


def node_dir() -> Path:
    """The versioned cache directory of the real nodes' runtime (bin/, images/)."""
    v = versions()
    key = f"containerd-{v['CONTAINERD_VERSION']}_images-{v['NODE_IMAGES_VERSION']}"
    return Path(os.environ.get("TESTENV_NODE_DIR") or _cache_root() / key)


def node_image_name(kind: str) -> str:
    """The name an image from the node dir is imported under (`localhost/testenv/shell:1`)."""
    return f"localhost/testenv/{kind}:{versions()['NODE_IMAGES_VERSION']}"


def node_image_archives(directory: Path) -> list[Path]:
    return [directory / "images" / f"{kind}.oci.tar" for kind in NODE_IMAGES]


def missing(bin_dir: Path) -> list[str]:
    return [c for c in BUILT if not os.access(bin_dir / c, os.X_OK)]


def missing_node_parts(directory: Path) -> list[str]:
    absent = [b for b in NODE_BINARIES if not os.access(directory / "bin" / b, os.X_OK)]
    return absent + [str(p.name) for p in node_image_archives(directory) if not p.is_file()]


def cached_bin_dir(release: str | None = None) -> Path | None:
    """The bin dir if every binary is already there ($TESTENV_BIN_DIR wins, but for a
    ``release`` named), else None."""
    env = None if release else os.environ.get("TESTENV_BIN_DIR")
    bin_dir = Path(env) if env else cache_bin_dir(release)
    return bin_dir if not missing(bin_dir) else None


def why_unbuildable(release: str | None = None) -> str | None:
    """A one-line reason the binaries can be neither found nor built, or None if they can."""
    if cached_bin_dir(release) is not None:
        return None
    if shutil.which("go") is None:
        return (
            "Go toolchain not found on PATH and the control-plane binaries are not cached in "
            f"{cache_bin_dir(release)}; install Go (or set TESTENV_BIN_DIR) and run "
            "`hack/testenv build`"
        )
    if build_script() is None:
        return "hack/build-components.sh not found (run from the gpu-operator checkout)"
    return None


def _run_script(target: str, log: IO[str] | None, release: str | None = None) -> Path:
    script = build_script()
    assert script is not None
    # The stand-ins' list comes from this package: the script runs it with this Python (its
    # own default, the checkout's .venv, is absent in a git worktree or another venv).
    env = {**os.environ, "PYTHON": os.environ.get("PYTHON") or sys.executable}
    if release is not None:
        env["K8S_VERSION"] = release
    proc = subprocess.run(
        ["bash", str(script), target],
        stdout=subprocess.PIPE,
        stderr=log if log is not None else None,
        text=True,
        check=False,
        env=env,
    )
    if proc.returncode != 0:
        raise BinariesError(f"{script} {target} failed with exit code {proc.returncode}")
    lines = proc.stdout.strip().splitlines()
    if not lines:
        raise BinariesError(f"{script} {target} printed no directory")
    return Path(lines[-1])


def images_dir() -> Path:
    """Where `make image` / `make standins` leave the project's image and the stand-ins."""
    return _cache_root() / "images"


def ensure_project_images(
    log: IO[str] | None = None, taken: threading.Event | None = None
) -> list[Path]:
    """Build (or find current) the project's image from its Dockerfile and the SIMULATED
    stand-ins for NVIDIA's images; return their OCI archives, for `load_image`. A warm call
    with an unchanged tree takes seconds; a changed tree rebuilds (PyPI is reached for the
    Dockerfile's `pip wheel`). ``taken`` is set once this call holds the build's lock."""
    if build_script() is None:
        raise BinariesError("hack/build-components.sh not found (run from the checkout)")
    if shutil.which("buildah") is None:
        raise BinariesError("buildah not found: install Debian's buildah (`make packages`)")
    # Two test workers with real nodes may ask at once: one builds, the other then finds the
    # images current (the build writes into one cache directory).
    lock_path = _cache_root() / "images.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if taken is not None:
            taken.set()
        try:
            return [_run_script("image", log), _run_script("standins", log)]
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def ensure_binaries(log: IO[str] | None = None, release: str | None = None) -> Path:
    """Return the bin dir (of ``release``, else the default one), building the components
    first if any is missing (slow when cold).

    Build output goes to `log` when given (else inherits stderr); raises BinariesError.
    """
    cached = cached_bin_dir(release)
    if cached is not None:
        return cached
    reason = why_unbuildable(release)
    if reason:
        raise BinariesError(reason)
    bin_dir = _run_script("all", log, release)
    absent = missing(bin_dir)
    if absent:
        raise BinariesError(f"build finished but {', '.join(absent)} missing in {bin_dir}")
    return bin_dir


def ensure_node_runtime(log: IO[str] | None = None) -> Path:
    """Return the real nodes' runtime dir (containerd, pause, images), building it if needed
    (about a minute cold; needs Go and buildah)."""
    directory = node_dir()
    if not missing_node_parts(directory):
        return directory
    if shutil.which("go") is None:
        raise BinariesError(
            f"Go toolchain not found on PATH and the real nodes' runtime is not cached in "
            f"{directory}; install Go and run `hack/testenv build`"
        )
    if build_script() is None:
        raise BinariesError("hack/build-components.sh not found (run from the checkout)")
    built = _run_script("nodes", log)
    absent = missing_node_parts(built)
    if absent:
        raise BinariesError(f"build finished but {', '.join(absent)} missing in {built}")
    return built


def ensure_toxiproxy(bin_dir: Path, log: IO[str] | None = None) -> Path:
    """toxiproxy-server in ``bin_dir`` (the chaos suite's TCP fault proxy), building it first
    when it is missing (a minute cold; needs Go)."""
    binary = bin_dir / "toxiproxy-server"
    if os.access(binary, os.X_OK):
        return binary
    if shutil.which("go") is None or build_script() is None:
        raise BinariesError(
            f"toxiproxy-server is not in {bin_dir} and cannot be built here (Go and "
            "hack/build-components.sh needed): run `hack/build-components.sh toxiproxy`"
        )
    built = _run_script("toxiproxy", log) / "toxiproxy-server"
    if not os.access(built, os.X_OK):
        raise BinariesError(f"build finished but {built} is missing")
    return built
