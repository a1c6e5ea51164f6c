"""The templates live in the repository's templates/ and install as ``gpu_operator.templates``:
found by an editable install, in the wheel (setup.py maps the folder) and in the image."""

from __future__ import annotations

import importlib.resources
from pathlib import Path

import pytest

import gpu_operator
from gpu_operator.render.components import REGISTRY
from gpu_operator.render.engine import environment
from tests.paths import REPO
from tests.unit.install.test_dockerfile import DOCKERFILE, instructions


def package_templates() -> Path:
    root = importlib.resources.files("gpu_operator.templates")
    assert isinstance(root, Path), root  # a folder on disk, not a zip
    return root


def test_every_component_folder_resolves_as_a_package_resource() -> None:
    root = package_templates()
    for comp in REGISTRY:
        assert (root / comp.name / "0500_daemonset.yaml.j2").is_file(), comp.name
    assert (root / "_shared" / "_daemonset.j2").is_file()


def test_the_engine_loads_exactly_the_package_templates() -> None:
    root = package_templates()
    on_disk = {p.relative_to(root).as_posix() for p in root.rglob("*.j2")}
    assert set(environment().list_templates(extensions=["j2"])) == on_disk


def test_an_editable_install_reads_the_repository_folder() -> None:
    """From a checkout (``pip install -e``), edits to templates/ are what renders."""
    if not Path(gpu_operator.__file__).resolve().is_relative_to(REPO):
        pytest.skip("gpu_operator is installed from a wheel, not this checkout")
    assert package_templates().resolve() == REPO / "templates"


def test_the_image_build_copies_the_templates() -> None:
    copies = [i.args.split() for i in instructions(DOCKERFILE) if i.keyword == "COPY"]
    sources = {src for parts in copies for src in parts[:-1]}
    assert {"templates", "setup.py", "pyproject.toml", "src"} <= sources
