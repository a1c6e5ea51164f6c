"""Image references: completing what the ClusterPolicy gives from the fallbacks.

NVIDIA's operator rejects a component that sets only some of repository/image/version, and
users still end up with paths like ``/:570.x`` (gpu-operator issue 2006). Here each missing part
comes from the operator's fallback env image, then from the built-in default, so the result is
always a complete reference.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from gpu_operator.api.base import ImageRef


@dataclass(frozen=True)
class ImageDefault:
    """A complete image reference split into the three ClusterPolicy fields."""

    repository: str
    image: str
    version: str

    @property
    def reference(self) -> str:
        return join_reference(self.repository, self.image, self.version)


@dataclass(frozen=True)
class ImageParts:
    """A possibly incomplete reference; ``None`` marks a part that was not given."""

    repository: str | None = None
    image: str | None = None
    version: str | None = None


def is_digest(version: str) -> bool:
    """Tags cannot contain ':', so ``sha256:...`` (any ``algo:hex``) is a digest."""
    return ":" in version


def join_reference(repository: str, image: str, version: str) -> str:
    """``repo/image:tag`` or ``repo/image@sha256:...``; an empty repository is omitted."""
    path = f"{repository.rstrip('/')}/{image}" if repository else image
    if not version:
        return path
    return f"{path}@{version}" if is_digest(version) else f"{path}:{version}"


@functools.lru_cache(maxsize=256)  # a handful of references, split on every render
def split_reference(reference: str) -> ImageParts:
    """``nvcr.io/nvidia/driver:580`` -> (nvcr.io/nvidia, driver, 580); digests keep ``sha256:``.

    A ':' before the last '/' is a registry port, not a tag.
    """
    path, version = reference, None
    if "@" in reference:
        path, version = reference.split("@", 1)
    else:
        slash = reference.rfind("/")
        colon = reference.rfind(":")
        if colon > slash:
            path, version = reference[:colon], reference[colon + 1 :]
    repository, _, image = path.rpartition("/")
    return ImageParts(repository or None, image or None, version or None)


def _given(value: str | None) -> str | None:
    """NVIDIA's documents write ``""`` for "not set"; treat it like absent."""
    return value if value else None


def resolve_image(ref: ImageRef | None, default: ImageDefault, env_image: str | None) -> str:
    """The image a component runs.

    Parts the spec gives win; each missing part comes from ``env_image`` (the operator's
    fallback env, parsed) when that has it, else from ``default``. An ``image`` that is itself a
    full reference (contains '/', no repository given) is used as is; it only borrows a tag
    when it has none.
    """
    fallback = default
    if env_image:
        env = split_reference(env_image)
        fallback = ImageDefault(
            env.repository or default.repository,
            env.image or default.image,
            env.version or default.version,
        )
    repository = _given(ref.repository) if ref else None
    image = _given(ref.image) if ref else None
    version = _given(ref.version) if ref else None
    if image is not None and repository is None and "/" in image:
        if split_reference(image).version is not None:
            return image
        return join_reference("", image, version or fallback.version)
    return join_reference(
        repository or fallback.repository, image or fallback.image, version or fallback.version
    )


def with_os_tag(reference: str, os_tag: str) -> str:
    """Driver images are per OS: ``driver:580.95.05`` -> ``driver:580.95.05-ubuntu22.04``.

    Digests name one exact image and are left alone, as is a tag that already ends in the
    suffix (a full reference copied from a running cluster).
    """
    parts = split_reference(reference)
    if parts.version is None or is_digest(parts.version):
        return reference
    suffix = f"-{os_tag}"
    if parts.version.endswith(suffix):
        return reference
    return reference + suffix
