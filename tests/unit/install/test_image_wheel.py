"""The image's wheel: the Dockerfile's builder builds the runtime wheel (setup.py), which holds
everything under src/ and templates/ but the test environment (``gpu_operator.testenv``, the
fleet simulator with it), and nothing it holds imports what it leaves out.

The wheel is built here as the builder builds it, from a copy of what the builder COPYs, with
the development environment's setuptools (the dev extra) and no network."""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile

import pytest

from tests.paths import REPO
from tests.unit.install.test_dockerfile import DOCKERFILE, instructions

SETTING = "GPU_OPERATOR_WHEEL"
TESTENV = "gpu_operator/testenv/"
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
# A PEP 517 build without pip (pip would prepare the metadata in a run of its own first).
BUILD = "import sys, setuptools.build_meta as b; print(b.build_wheel(sys.argv[1]))"


def builder_copies() -> list[str]:
    copies = [i.args.split() for i in instructions(DOCKERFILE) if i.keyword == "COPY"]
    return [src for parts in copies for src in parts[:-1] if not src.startswith("--")]


def needed_setuptools() -> int:
    """The major version pyproject.toml's build-system asks for (``setuptools>=N``)."""
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"]
    match = next(m for r in requires if (m := re.fullmatch(r"setuptools>=(\d+)", r)))
    return int(match[1])


@pytest.fixture(scope="module")
def runtime_wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    have, needed = importlib.metadata.version("setuptools"), needed_setuptools()
    if int(have.split(".")[0]) < needed:
        pytest.skip(
            f"setuptools {have}, the build-system needs >={needed}: reinstall the dev extra "
            "(make unit does, after pyproject.toml changed)"
        )
    context = tmp_path_factory.mktemp("image-context")
    for name in builder_copies():
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, context / name, ignore=IGNORED)
        else:
            shutil.copy2(source, context / name)
    out = context / "wheels"
    built = subprocess.run(
        [sys.executable, "-c", BUILD, str(out)],
        cwd=context,
        env={**os.environ, SETTING: "runtime"},
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-4000:]
    return zipfile.ZipFile(out / built.stdout.split()[-1])


def shipped(wheel: zipfile.ZipFile) -> set[str]:
    return {n for n in wheel.namelist() if n.startswith("gpu_operator/")}


def test_the_builder_builds_the_runtime_wheel_and_the_image_installs_only_it() -> None:
    builder = [i for i in instructions(DOCKERFILE) if i.stage == 0]
    set_in_env = any(
        i.keyword == "ENV" and re.search(rf"(^|\s){SETTING}=runtime(\s|$)", i.args) for i in builder
    )
    wheel_runs = [i.args for i in builder if i.keyword == "RUN" and "pip wheel" in i.args]
    assert len(wheel_runs) == 1, wheel_runs
    assert set_in_env or re.search(rf"(^|\s){SETTING}=runtime pip wheel ", wheel_runs[0])
    installs = [
        i.args for i in instructions(DOCKERFILE) if i.stage == 1 and "pip install" in i.args
    ]
    assert len(installs) == 1 and "--no-index --find-links=/wheels" in installs[0], installs


def test_an_unknown_build_is_refused_rather_than_built_whole() -> None:
    refused = subprocess.run(
        [sys.executable, "setup.py", "--version"],
        cwd=REPO,
        env={**os.environ, SETTING: "slim"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert refused.returncode != 0 and f"{SETTING}='slim'" in refused.stderr, refused.stderr


def test_the_runtime_wheel_holds_no_test_environment(runtime_wheel: zipfile.ZipFile) -> None:
    names = shipped(runtime_wheel)
    assert not {n for n in names if n.startswith(TESTENV)}
    assert not {n for n in names if "fleetsim" in n or n.endswith("/simulate.py")}
    assert not {n for n in names if n.endswith(".sh")}  # testenv's node init script


def test_the_runtime_wheel_holds_everything_else(runtime_wheel: zipfile.ZipFile) -> None:
    """Every module and data file of src/ outside testenv, templates/ as gpu_operator.templates:
    the simulation the agents' --simulate runs, the NVML profiles, the stub driver's sources."""
    src = REPO / "src"
    expected = {
        p.relative_to(src).as_posix()
        for p in (src / "gpu_operator").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }
    expected = {n for n in expected if not n.startswith(TESTENV)}
    expected |= {
        f"gpu_operator/{p.relative_to(REPO).as_posix()}"
        for p in (REPO / "templates").rglob("*")
        if p.is_file()
    }
    names = shipped(runtime_wheel)
    assert names == expected, (sorted(expected - names), sorted(names - expected))
    for needed in (
        "gpu_operator/sim/nvml/__init__.py",
        "gpu_operator/sim/operands.py",
        "gpu_operator/sim/profiles/a100-40gb.yaml",
        "gpu_operator/templates/device-plugin/0500_daemonset.yaml.j2",
    ):
        assert needed in names, needed
    entry_points = next(n for n in runtime_wheel.namelist() if n.endswith("/entry_points.txt"))
    assert "gpu-operator = gpu_operator.cli:main" in runtime_wheel.read(entry_points).decode()


def imported(module: str, source: str) -> set[str]:
    """The modules ``source`` (module ``module``) imports, relative imports resolved, and every
    string naming a gpu_operator module (importlib.import_module, importlib.resources)."""
    package = module.split(".")
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[: len(package) - node.level], *filter(None, [base])])
            found |= {base} | {f"{base}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found |= {node.value} if re.fullmatch(r"gpu_operator(\.\w+)+", node.value) else set()
    return found


def test_nothing_in_the_runtime_wheel_imports_the_test_environment(
    runtime_wheel: zipfile.ZipFile,
) -> None:
    reaching = {}
    for name in shipped(runtime_wheel):
        if not name.endswith(".py"):
            continue
        module = name.removesuffix(".py").replace("/", ".")  # a package's: pkg.__init__
        found = imported(module, runtime_wheel.read(name).decode())
        testenv = sorted(m for m in found if m.startswith("gpu_operator.testenv"))
        if testenv:
            reaching[name] = testenv
    assert not reaching
