"""Compiling the stub driver's libraries and programs with gcc, once per set of sources.

The artefacts are version- and node-independent (the GPU table and a versioned soname are
patched in when a driver root is laid out), so a build is keyed by a hash of the C sources and
the compiler flags alone, and kept in ``$XDG_CACHE_HOME/gpu-operator-stubdriver/<hash>/``
(``~/.cache/...`` without it). A build goes to a temporary folder renamed into place when
complete, so concurrent builders (pytest-xdist workers) each find a whole one.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from .libraries import LIBRARIES, PROGRAMS
from .table import StubDriverError

SOURCE_DIR = Path(__file__).parent / "c"
NO_COMPILER = "the stub driver needs a C compiler: install gcc (Debian: build-essential)"
CC = "gcc"
_COMMON = ("-O2", "-Wall", "-Wextra", "-Wl,--as-needed")
_LIBRARY = ("-fPIC", "-shared", "-fvisibility=hidden", "-Wl,-z,defs")
_LIBS = ("-ldl", "-lpthread")  # part of libc since glibc 2.34: --as-needed drops them there
_FORMAT = "1"  # bump when the layout of a build folder changes


def compile_commands() -> list[tuple[str, list[str]]]:
    """Each artefact's file name and the gcc arguments that make it (run in the build
    folder; ``{src}`` stands for the source folder)."""
    commands: list[tuple[str, list[str]]] = []
    for lib in LIBRARIES:
        args = [*_COMMON, *_LIBRARY, f"-Wl,-soname,{lib.link_soname()}"]
        commands.append((lib.artefact, [*args, "-o", lib.artefact, f"{{src}}/{lib.source}"]))
        commands[-1][1].extend(_LIBS)
    for program in PROGRAMS:
        args = [*_COMMON, "-o", program.name, f"{{src}}/{program.source}", "-ldl"]
        commands.append((program.name, args))
    return commands


def source_hash() -> str:
    """What a build depends on: the C sources and headers, the commands and the format."""
    digest = hashlib.sha256(_FORMAT.encode())
    for path in sorted(SOURCE_DIR.iterdir()):
        if path.suffix in (".c", ".h"):
            digest.update(f"\0{path.name}\0".encode())
            digest.update(path.read_bytes())
    for name, args in compile_commands():
        digest.update(f"\0{name}\0{' '.join(args)}".encode())
    return digest.hexdigest()[:16]


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpu-operator-stubdriver"


def artefact_names() -> list[str]:
    return [name for name, _ in compile_commands()]


def build_stubs(out_dir: Path | None = None) -> Path:
    """The folder holding every artefact (``libcuda.so``, ``nvidia-smi``, ...), built now
    unless a complete one for these sources is there: ``<out_dir or cache>/<hash>``."""
    base = out_dir if out_dir is not None else default_cache_dir()
    dest = base / source_hash()
    if _complete(dest):
        return dest
    compiler = shutil.which(CC)
    if compiler is None:
        raise StubDriverError(NO_COMPILER)
    base.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=base))
    try:
        for name, args in compile_commands():
            argv = [compiler, *(a.replace("{src}", str(SOURCE_DIR)) for a in args)]
            done = subprocess.run(argv, cwd=work, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise StubDriverError(f"building {name} failed:\n{done.stderr.strip()}")
        work.chmod(0o755)
        if dest.exists() and not _complete(dest):  # emptied by hand: build it anew
            shutil.rmtree(dest, ignore_errors=True)
        try:
            work.rename(dest)
        except OSError:  # another builder got there first
            if not _complete(dest):
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return dest


def _complete(folder: Path) -> bool:
    return all((folder / name).is_file() for name in artefact_names())
