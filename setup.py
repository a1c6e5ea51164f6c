"""Where the packages are; everything else about the project is in pyproject.toml.

The component templates live in templates/ at the top of the repository and install as the
package ``gpu_operator.templates``. pyproject.toml cannot map a folder outside src/ into a
package and still find the packages, so both are computed here: every package under src/, and
templates/ with its folders (the project's component folders).

Two builds, chosen by GPU_OPERATOR_WHEEL: unset (or ``full``) builds everything, which is what
a checkout's ``pip install -e '.[dev]'`` and ``pip install .`` get; ``runtime`` (the Dockerfile's
builder sets it) leaves out ``gpu_operator.testenv`` and everything under it: the local control
plane, its PKI and fault proxy, the demo and the fleet simulator, which run on a developer's
machine and never in a pod (nothing else in the package imports them). Its data (testenv's
shell scripts) is package data of ``gpu_operator.testenv`` itself, so it goes with the package.
One distribution and one version either way: the image installs the runtime wheel it just built.
"""

import os

from setuptools import find_namespace_packages, setup

TEMPLATES = "gpu_operator.templates"
TESTENV = "gpu_operator.testenv"
BUILDS = ("full", "runtime")

build = os.environ.get("GPU_OPERATOR_WHEEL") or "full"
if build not in BUILDS:
    raise SystemExit(f"GPU_OPERATOR_WHEEL={build!r}: expected one of {', '.join(BUILDS)}")
packages = find_namespace_packages("src", include=["gpu_operator*"])
if build == "runtime":
    packages = [p for p in packages if p != TESTENV and not p.startswith(f"{TESTENV}.")]

setup(
    package_dir={"": "src", TEMPLATES: "templates"},
    packages=[
        *packages,
        TEMPLATES,
        *(f"{TEMPLATES}.{name}" for name in find_namespace_packages("templates")),
    ],
)
