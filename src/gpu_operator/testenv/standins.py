"""Stand-ins for NVIDIA's operand images, for the testenv's real nodes only.

NVIDIA's driver, container-toolkit and device-plugin images cannot be pulled here. Each
stand-in is built FROM the project's image (`make standins`), named exactly as the rendered
defaults name NVIDIA's image (so nothing in the ClusterPolicy or the rendered DaemonSets
changes), labelled SIMULATED, and provides the commands those DaemonSets run:

- driver: `nvidia-driver init` and `nvidia-smi` -> `gpu-operator agent simulate-driver` (also
  tagged with UPGRADE_DRIVER_VERSION, for the driver upgrade on real nodes)
- k8s-driver-manager (the driver pod's init container): `driver-manager uninstall_driver` ->
  `gpu-operator agent simulate-driver manager` (unloads the previous simulated driver)
- container-toolkit: its entrypoint -> `gpu-operator agent simulate-toolkit`
- device-plugin: `nvidia-device-plugin` -> the project's own `gpu-operator agent device-plugin`

They reach a node only through `hack/testenv load-image` (an explicit testenv/demo step): a
real cluster pulls NVIDIA's real images and never sees these.

`python -m gpu_operator.testenv.standins CONTEXT_DIR BASE_IMAGE` writes the build context (a
Containerfile and the commands) and prints one line per stand-in: name, then its entrypoint as
JSON, tab-separated.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from gpu_operator.render import components
from gpu_operator.render.driver import DEFAULT_MANAGER
from gpu_operator.render.images import with_os_tag

from . import nodes

SIMULATED_LABEL = "SIMULATED"
# A second driver version, tagged on the driver stand-in too, so that the real-node e2e can roll
# a driver upgrade across the real nodes (for the nodes, what changes is the image reference).
UPGRADE_DRIVER_VERSION = "580.105.08"


@dataclass(frozen=True)
class StandIn:
    component: str  # the render registry's name
    reference: str  # NVIDIA's default image, exactly as rendered for the testenv's nodes
    entrypoint: tuple[str, ...]


# The commands each stand-in adds (under /usr/local/bin) and what they run.
COMMANDS = {
    "nvidia-driver": 'exec gpu-operator agent simulate-driver "$@"',
    "nvidia-smi": "exec gpu-operator agent simulate-driver smi",
    "driver-manager": 'exec gpu-operator agent simulate-driver manager "$@"',
    "nvidia-toolkit": 'exec gpu-operator agent simulate-toolkit "$@"',
    "nvidia-device-plugin": (
        'echo "SIMULATED: NVIDIA device plugin stand-in: gpu-operator agent device-plugin on '
        'simulated NVML" >&2\nexec gpu-operator agent device-plugin "$@"'
    ),
}
ENTRYPOINTS = {
    "driver": ("nvidia-driver", "init"),
    "container-toolkit": ("nvidia-toolkit",),
    "device-plugin": ("nvidia-device-plugin",),
}


def node_os_tag() -> str:
    """The OS the testenv's GPU nodes report (NFD labels), as driver image tags spell it."""
    labels: dict[str, str] = nodes.node_manifest("x", gpu=True)["metadata"]["labels"]
    prefix = nodes.NFD_PREFIX
    return labels[f"{prefix}system-os_release.ID"] + labels[f"{prefix}system-os_release.VERSION_ID"]


def standins() -> list[StandIn]:
    found = []
    for name, entrypoint in ENTRYPOINTS.items():
        default = components.component(name).default_image
        assert default is not None, name
        reference = default.reference
        if name == "driver":
            repository = reference.rsplit(":", 1)[0]
            upgrade = with_os_tag(f"{repository}:{UPGRADE_DRIVER_VERSION}", node_os_tag())
            found.append(StandIn(name, upgrade, entrypoint))
            reference = with_os_tag(reference, node_os_tag())
        found.append(StandIn(name, reference, entrypoint))
    # Not a component of its own: the init container of every driver pod.
    found.append(StandIn("driver-manager", DEFAULT_MANAGER.reference, ("driver-manager",)))
    return found


def containerfile(base: str) -> str:
    """One image with every stand-in command; each stand-in is it, named and with an
    entrypoint of its own. Root, as NVIDIA's images run (the project's image is nonroot)."""
    return (
        f"FROM {base}\n"
        f'LABEL org.opencontainers.image.description="{SIMULATED_LABEL} stand-ins for NVIDIA '
        'operand images (gpu-operator testenv); not NVIDIA software"\n'
        "USER 0:0\n"
        "COPY bin/ /usr/local/bin/\n"
    )


def write_context(directory: Path, base: str) -> None:
    (directory / "bin").mkdir(parents=True, exist_ok=True)
    (directory / "Containerfile").write_text(containerfile(base))
    for command, body in COMMANDS.items():
        path = directory / "bin" / command
        path.write_text(f"#!/bin/sh\n# {SIMULATED_LABEL} (gpu-operator testenv stand-in)\n{body}\n")
        path.chmod(0o755)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(
            "usage: python -m gpu_operator.testenv.standins CONTEXT_DIR BASE_IMAGE", file=sys.stderr
        )
        return 2
    write_context(Path(argv[0]), argv[1])
    for standin in standins():
        print(f"{standin.reference}\t{json.dumps(list(standin.entrypoint))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
