"""tests/unit keeps the shape of src/gpu_operator (the rule is in tests/unit/__init__.py): every
folder of test modules is a package of the source, so a test is found where its subject is."""

from __future__ import annotations

from pathlib import Path

from tests.paths import REPO

UNIT = REPO / "tests" / "unit"
SOURCE = REPO / "src" / "gpu_operator"


def misplaced(unit: Path, source: Path) -> list[str]:
    """Folders under ``unit`` that hold test modules but name no package under ``source``."""
    return sorted(
        str(folder.relative_to(unit))
        for folder in unit.rglob("*")
        if folder.is_dir()
        and any(folder.glob("test_*.py"))
        and not (source / folder.relative_to(unit) / "__init__.py").is_file()
    )


def test_every_folder_of_tests_is_a_package_of_the_source() -> None:
    assert misplaced(UNIT, SOURCE) == []


def test_a_folder_of_tests_without_its_package_is_named(tmp_path: Path) -> None:
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "src" / "pkg" / "__init__.py").write_text("")
    for folder in ("pkg", "gone", "pkg/data"):
        (tmp_path / "unit" / folder).mkdir(parents=True, exist_ok=True)
    (tmp_path / "unit" / "pkg" / "test_a.py").write_text("")
    (tmp_path / "unit" / "gone" / "test_b.py").write_text("")
    (tmp_path / "unit" / "pkg" / "data" / "values.yaml").write_text("")
    assert misplaced(tmp_path / "unit", tmp_path / "src") == ["gone"]
