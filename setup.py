"""Where the packages are; everything else about the project is in pyproject.toml.

The component templates live in templates/ at the top of the repository and install as the
package ``gpu_operator.templates``. pyproject.toml cannot map a folder outside src/ into a
package and still find the packages, so both are computed here: every package under src/, and
templates/ with its folders (the project's component folders).
"""

from setuptools import find_namespace_packages, setup

TEMPLATES = "gpu_operator.templates"

setup(
    package_dir={"": "src", TEMPLATES: "templates"},
    packages=[
        *find_namespace_packages("src", include=["gpu_operator*"]),
        TEMPLATES,
        *(f"{TEMPLATES}.{name}" for name in find_namespace_packages("templates")),
    ],
)
