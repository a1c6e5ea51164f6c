"""The component templates, installed as the package ``gpu_operator.templates``.

They live at the top of the repository for readers and are mapped into the package by
pyproject.toml (``package-dir``), so the wheel, the image and an editable install carry them.
"""
