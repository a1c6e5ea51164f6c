"""Image references and node OS tags: every completion rule, as tables."""

from __future__ import annotations

import pytest

from gpu_operator.api.base import ImageRef
from gpu_operator.render.facts import NodeOS
from gpu_operator.render.images import (
    ImageDefault,
    ImageParts,
    resolve_image,
    split_reference,
    with_os_tag,
)

DEFAULT = ImageDefault("nvcr.io/nvidia", "driver", "580.95.05")
DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("ref", "env", "expected"),
    [
        # nothing given: the built-in default
        (None, None, "nvcr.io/nvidia/driver:580.95.05"),
        (ImageRef(), None, "nvcr.io/nvidia/driver:580.95.05"),
        # NVIDIA documents write "" for unset
        (ImageRef(repository="", image="", version=""), None, "nvcr.io/nvidia/driver:580.95.05"),
        # all three parts given
        (
            ImageRef(repository="r.example.com/x", image="drv", version="1"),
            None,
            "r.example.com/x/drv:1",
        ),
        # only the version: NVIDIA issue 2006 (`/:570.x`) cannot happen
        (ImageRef(version="570.172.08"), None, "nvcr.io/nvidia/driver:570.172.08"),
        # only the repository (a mirror), with a registry port
        (
            ImageRef(repository="mirror:5000/nvidia"),
            None,
            "mirror:5000/nvidia/driver:580.95.05",
        ),
        (ImageRef(repository="mirror/nvidia/"), None, "mirror/nvidia/driver:580.95.05"),
        # only the image name
        (ImageRef(image="driver-custom"), None, "nvcr.io/nvidia/driver-custom:580.95.05"),
        # a digest as the version
        (ImageRef(version=DIGEST), None, f"nvcr.io/nvidia/driver@{DIGEST}"),
        # a full reference in `image`, used as is
        (ImageRef(image="quay.io/me/driver:9"), None, "quay.io/me/driver:9"),
        (ImageRef(image=f"quay.io/me/driver@{DIGEST}"), None, f"quay.io/me/driver@{DIGEST}"),
        (ImageRef(image="localhost:5000/driver:9"), None, "localhost:5000/driver:9"),
        # a full reference without a tag borrows the version, then the default's
        (ImageRef(image="quay.io/me/driver", version="7"), None, "quay.io/me/driver:7"),
        (ImageRef(image="quay.io/me/driver"), None, "quay.io/me/driver:580.95.05"),
        # with a repository given, `image` is a name even if it has a '/'
        (
            ImageRef(repository="r.example.com", image="nvidia/driver", version="1"),
            None,
            "r.example.com/nvidia/driver:1",
        ),
        # the operator's env fallback fills what the spec leaves out
        (None, "env.example.com/nv/drv:2", "env.example.com/nv/drv:2"),
        (ImageRef(version="3"), "env.example.com/nv/drv:2", "env.example.com/nv/drv:3"),
        (ImageRef(repository="spec.io/a"), "env.example.com/nv/drv:2", "spec.io/a/drv:2"),
        (None, f"env.example.com/nv/drv@{DIGEST}", f"env.example.com/nv/drv@{DIGEST}"),
        # an env image missing parts is completed from the default
        (None, "env.example.com/nv/drv", "env.example.com/nv/drv:580.95.05"),
        (None, "drv:2", "nvcr.io/nvidia/drv:2"),
        (None, "", "nvcr.io/nvidia/driver:580.95.05"),
    ],
)
def test_resolve_image(ref: ImageRef | None, env: str | None, expected: str) -> None:
    assert resolve_image(ref, DEFAULT, env) == expected


@pytest.mark.parametrize(
    ("reference", "parts"),
    [
        ("nvcr.io/nvidia/driver:580", ImageParts("nvcr.io/nvidia", "driver", "580")),
        ("localhost:5000/driver", ImageParts("localhost:5000", "driver", None)),
        ("localhost:5000/driver:1", ImageParts("localhost:5000", "driver", "1")),
        (f"a/b@{DIGEST}", ImageParts("a", "b", DIGEST)),
        ("ubuntu", ImageParts(None, "ubuntu", None)),
        ("ubuntu:22.04", ImageParts(None, "ubuntu", "22.04")),
    ],
)
def test_split_reference(reference: str, parts: ImageParts) -> None:
    assert split_reference(reference) == parts


@pytest.mark.parametrize(
    ("reference", "tag", "expected"),
    [
        (
            "nvcr.io/nvidia/driver:580.95.05",
            "ubuntu22.04",
            "nvcr.io/nvidia/driver:580.95.05-ubuntu22.04",
        ),
        ("nvcr.io/nvidia/driver:580.95.05", "rhel9", "nvcr.io/nvidia/driver:580.95.05-rhel9"),
        (f"nvcr.io/nvidia/driver@{DIGEST}", "ubuntu22.04", f"nvcr.io/nvidia/driver@{DIGEST}"),
        # already suffixed (copied from a running cluster): not doubled
        ("r/driver:580-ubuntu22.04", "ubuntu22.04", "r/driver:580-ubuntu22.04"),
        ("localhost:5000/driver", "ubuntu22.04", "localhost:5000/driver"),
    ],
)
def test_with_os_tag(reference: str, tag: str, expected: str) -> None:
    assert with_os_tag(reference, tag) == expected


@pytest.mark.parametrize(
    ("node_os", "tag"),
    [
        (NodeOS("ubuntu", "22.04"), "ubuntu22.04"),
        (NodeOS("ubuntu", "24.04"), "ubuntu24.04"),
        (NodeOS("rhel", "9.4"), "rhel9"),
        (NodeOS("rhel", "8.10"), "rhel8"),
        (NodeOS("rocky", "9.3"), "rocky9"),
        (NodeOS("ol", "9.2"), "ol9"),
        (NodeOS("centos", "7"), "centos7"),
        (NodeOS("sles", "15.6"), "sles15.6"),
        (NodeOS("debian", "12"), "debian12"),
    ],
)
def test_node_os_tag(node_os: NodeOS, tag: str) -> None:
    assert node_os.tag == tag


@pytest.mark.parametrize(
    ("text", "node_os"),
    [
        ("ubuntu22.04", NodeOS("ubuntu", "22.04")),
        ("rhel9.4", NodeOS("rhel", "9.4")),
        ("rocky9.3", NodeOS("rocky", "9.3")),
        ("RHEL9", NodeOS("rhel", "9")),
    ],
)
def test_node_os_parse(text: str, node_os: NodeOS) -> None:
    assert NodeOS.parse(text) == node_os


@pytest.mark.parametrize("text", ["", "ubuntu", "22.04", "ubuntu-22.04", "ubuntu22.04x"])
def test_node_os_parse_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="not an OS"):
        NodeOS.parse(text)
