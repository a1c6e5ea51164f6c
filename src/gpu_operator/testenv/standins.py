"""Stand-ins for NVIDIA's operand images, for the testenv's real nodes only.

NVIDIA's images cannot be pulled here. Each stand-in is built FROM the project's image
(`make standins`), named exactly as a rendering names NVIDIA's image (so nothing in the
ClusterPolicy or the rendered DaemonSets changes), labelled SIMULATED, and provides the commands
those DaemonSets run. Two renderings name them: the project's defaults (examples/
clusterpolicy.yaml), and NVIDIA's Helm chart's default ClusterPolicy, reconciled unchanged on
real nodes too (HELM_DEFAULT_IMAGES: its versions, and the images it names that the project's
defaults replace with the project's own):

- driver: `nvidia-driver init` -> `gpu-operator agent simulate-driver`, which lays out the stub
  driver (its artefacts ship in the image) in the driver root; `nvidia-smi` -> the stub's own
  nvidia-smi from there (also
  tagged with UPGRADE_DRIVER_VERSION, for the driver upgrade on real nodes); each tag's image
  sets DRIVER_VERSION to its version, as NVIDIA's driver images do, so the simulated NVML
  reports the version the policy asked for
- k8s-driver-manager (the driver pod's init container): `driver-manager uninstall_driver` ->
  `gpu-operator agent simulate-driver manager` (unloads the previous simulated driver)
- container-toolkit: its entrypoint -> `gpu-operator agent simulate-toolkit`
- k8s-device-plugin: `nvidia-device-plugin` -> the project's own `gpu-operator agent
  device-plugin`; `gpu-feature-discovery` (the same image) -> `gpu-operator agent discover`,
  which labels the node through the API (NVIDIA's writes NFD's features.d file; the testenv has
  no NFD, and the rendered ClusterRole grants it nodes get and patch either way)
- k8s-mig-manager: its entrypoint -> `gpu-operator agent mig-manager` (CONFIG_FILE, NODE_NAME,
  DEFAULT_GPU_CLIENTS_NAMESPACE as NVIDIA's reads them)
- dcgm-exporter: its entrypoint -> `gpu-operator agent exporter` (DCGM_EXPORTER_LISTEN,
  DCGM_EXPORTER_COLLECTORS, DCGM_EXPORTER_KUBERNETES and the mounted PodResources socket)

and, for GPUs handed to virtual machines (a policy with sandbox workloads, rendering
"sandbox"), on the simulated PCI bus the harness lays out in each real node's
SIMULATED_PCI_ROOT (gpu_operator.sim.sandbox):

- the VFIO manager (NVIDIA's k8s-driver-manager image, the same stand-in as the driver's init
  container): `vfio-manage bind|unbind --all` -> `gpu-operator agent simulate-vfio-manager`,
  on the node's bus under the host root the DaemonSet mounts (HOST_ROOT)
- the sandbox validator (NVIDIA's gpu-operator image): `nvidia-validator` ->
  `gpu-operator agent simulate-sandbox-validator` (COMPONENT, WITH_WAIT, NODE_NAME; the
  vfio-pci check reads the bus under /host); its other components are not simulated
- kubevirt-gpu-device-plugin: its entrypoint -> `gpu-operator agent
  simulate-sandbox-device-plugin`, which reads the bus at /sys (the testenv's runtime shows a
  container given the node's /dev/vfio the simulated bus there) and tells the kubelet the
  VFIO device nodes where the node keeps them

None sets GPU_OPERATOR_SIMULATE: the operands NVIDIA runs with the `nvidia` RuntimeClass ask for
every GPU (NVIDIA_VISIBLE_DEVICES=all, as NVIDIA's images do) and get the stub driver from the
testenv's `nvidia` runtime (testenv/nvidia_runtime.py, applying the node's CDI spec), as
NVIDIA's get the driver's; loaded, the stub hands over to the simulated NVML.

They reach a node only through `hack/testenv load-image` (an explicit testenv/demo step): a
real cluster pulls NVIDIA's real images and never sees these.

`python -m gpu_operator.testenv.standins CONTEXT_DIR BASE_IMAGE` writes the build context (a
Containerfile and the commands) and prints one line per stand-in: name, its entrypoint as JSON
and its environment (`KEY=value` words), tab-separated.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from gpu_operator.labels import SIMULATED_DRIVER_ROOT as DRIVER_ROOT
from gpu_operator.labels import SIMULATED_PCI_ROOT as PCI_ROOT
from gpu_operator.render import components
from gpu_operator.render.driver import DEFAULT_MANAGER
from gpu_operator.render.images import with_os_tag

from . import nodes

SIMULATED_LABEL = "SIMULATED"
# A second driver version, tagged on the driver stand-in too, so that the real-node e2e can roll
# a driver upgrade across the real nodes (for the nodes, what changes is the image reference).
UPGRADE_DRIVER_VERSION = "580.105.08"


# NVIDIA's images as NVIDIA's Helm chart's default ClusterPolicy names them
# (reference/nvidia/clusterpolicy-helm-default.yaml; the driver's tag gets the node OS). A unit
# test renders that policy and fails on an image without a stand-in here.
HELM_DEFAULT_IMAGES = {
    "driver": "nvcr.io/nvidia/driver:595.91.07",
    "driver-manager": "nvcr.io/nvidia/cloud-native/k8s-driver-manager:v0.12.0",
    "container-toolkit": "nvcr.io/nvidia/k8s/container-toolkit:v1.20.0",
    "device-plugin": "nvcr.io/nvidia/k8s-device-plugin:v0.20.0",  # and gpu-feature-discovery
    "mig-manager": "nvcr.io/nvidia/cloud-native/k8s-mig-manager:v0.15.0",
    "dcgm-exporter": "nvcr.io/nvidia/k8s/dcgm-exporter:4.6.0-4.8.3-distroless",
}


@dataclass(frozen=True)
class StandIn:
    component: str  # the render registry's name ("driver-manager": the driver's init container)
    reference: str  # NVIDIA's image, exactly as rendered for the testenv's nodes
    entrypoint: tuple[str, ...]
    rendering: str = "defaults"  # which names it: "defaults", "upgrade" or "helm-default"
    env: tuple[str, ...] = ()  # the image's own `KEY=value` environment


# NVIDIA's images that ask the `nvidia` runtime for every GPU (their image env, from CUDA's base
# images): the testenv's runtime gives them the driver from the node's CDI spec, as NVIDIA's does.
ASKS_FOR_GPUS = ("device-plugin", "mig-manager", "dcgm-exporter")
# Where the build context has the stub driver's artefacts, and where the image keeps them.
STUB_CONTEXT = "stubdriver"
STUB_ARTEFACTS = "/usr/local/lib/gpu-operator-stubdriver"

# The commands each stand-in adds (under /usr/local/bin) and what they run.
COMMANDS = {
    # Where to write is said, never defaulted (the stand-ins refuse to run without it).
    "nvidia-driver": f'exec gpu-operator agent simulate-driver --driver-root {DRIVER_ROOT} "$@"',
    # The stub driver's own nvidia-smi, from the driver root the driver container installed.
    "nvidia-smi": (
        'root="${DRIVER_ROOT:-/run/nvidia/driver}"\n'
        'LD_LIBRARY_PATH="$root/usr/lib/x86_64-linux-gnu" exec "$root/usr/bin/nvidia-smi" "$@"'
    ),
    "driver-manager": (
        f'exec gpu-operator agent simulate-driver --driver-root {DRIVER_ROOT} manager "$@"'
    ),
    "nvidia-toolkit": 'exec gpu-operator agent simulate-toolkit "$@"',
    "nvidia-device-plugin": (
        'echo "SIMULATED: NVIDIA device plugin stand-in: gpu-operator agent device-plugin on '
        'simulated NVML" >&2\nexec gpu-operator agent device-plugin "$@"'
    ),
    "gpu-feature-discovery": (
        'echo "SIMULATED: NVIDIA GPU feature discovery stand-in: gpu-operator agent discover on '
        'simulated NVML, labelling the node through the API (no NFD features file)" >&2\n'
        'exec gpu-operator agent discover "$@"'
    ),
    "nvidia-mig-manager": (
        'echo "SIMULATED: NVIDIA MIG manager stand-in: gpu-operator agent mig-manager on '
        'simulated NVML" >&2\nexec gpu-operator agent mig-manager "$@"'
    ),
    "dcgm-exporter": (
        'echo "SIMULATED: NVIDIA DCGM exporter stand-in: gpu-operator agent exporter on '
        'simulated NVML" >&2\nexec gpu-operator agent exporter "$@"'
    ),
    # The passthrough stand-ins print their own SIMULATED lines.
    "vfio-manage": (
        "exec gpu-operator agent simulate-vfio-manager "
        f'--pci-root "${{HOST_ROOT:-/host}}{PCI_ROOT}" "$@"'
    ),
    "nvidia-validator": (
        f'exec gpu-operator agent simulate-sandbox-validator --pci-root "/host{PCI_ROOT}" "$@"'
    ),
    "nvidia-kubevirt-gpu-device-plugin": (
        f'exec gpu-operator agent simulate-sandbox-device-plugin --host-dev-root {PCI_ROOT} "$@"'
    ),
}
# Each image's entrypoint (a DaemonSet without a command runs it).
ENTRYPOINTS = {
    "driver": ("nvidia-driver", "init"),
    "driver-manager": ("driver-manager",),
    "container-toolkit": ("nvidia-toolkit",),
    "device-plugin": ("nvidia-device-plugin",),
    "mig-manager": ("nvidia-mig-manager",),
    "dcgm-exporter": ("dcgm-exporter",),
    # GPUs for virtual machines: rendered only with sandbox workloads on.
    "vfio-manager": ("vfio-manage",),
    "sandbox-validator": ("nvidia-validator",),
    "sandbox-device-plugin": ("nvidia-kubevirt-gpu-device-plugin",),
}
SANDBOX = ("vfio-manager", "sandbox-validator", "sandbox-device-plugin")


def node_os_tag() -> str:
    """The OS the testenv's GPU nodes report (NFD labels), as driver image tags spell it."""
    labels: dict[str, str] = nodes.node_manifest("x", gpu=True)["metadata"]["labels"]
    prefix = nodes.NFD_PREFIX
    return labels[f"{prefix}system-os_release.ID"] + labels[f"{prefix}system-os_release.VERSION_ID"]


def _default_reference(name: str) -> str | None:
    """NVIDIA's image the project's defaults render for ``name``; None where they render the
    project's own image."""
    if name == "driver-manager":  # not a component: the init container of every driver pod
        return DEFAULT_MANAGER.reference
    default = components.component(name).default_image
    return default.reference if default is not None else None


def standins() -> list[StandIn]:
    os_tag = node_os_tag()
    found: list[StandIn] = []
    for name, entrypoint in ENTRYPOINTS.items():
        default = _default_reference(name)
        if name in SANDBOX:
            named = [(default, "sandbox")]
        else:
            named = [(default, "defaults"), (HELM_DEFAULT_IMAGES[name], "helm-default")]
        if name == "driver" and default is not None:
            repository = default.rsplit(":", 1)[0]
            named.append((f"{repository}:{UPGRADE_DRIVER_VERSION}", "upgrade"))
        for reference, rendering in named:
            # One image per name: the VFIO manager's is the driver manager's (NVIDIA's
            # k8s-driver-manager carries vfio-manage), and the DaemonSet names its command.
            if reference is None or any(s.reference == reference for s in found):
                continue
            env: tuple[str, ...] = ()
            if name in ASKS_FOR_GPUS:
                env = ("NVIDIA_VISIBLE_DEVICES=all",)
            if name == "driver":
                env = (f"DRIVER_VERSION={reference.rsplit(':', 1)[1]}",)
                reference = with_os_tag(reference, os_tag)
            found.append(StandIn(name, reference, entrypoint, rendering, env))
    return found


def containerfile(base: str) -> str:
    """One image with every stand-in command and the stub driver's artefacts (which the driver
    stand-in lays out on the node; the image has no compiler); each stand-in is it, named and
    with an entrypoint of its own. Root, as NVIDIA's images run (the project's is nonroot)."""
    return (
        f"FROM {base}\n"
        f'LABEL org.opencontainers.image.description="{SIMULATED_LABEL} stand-ins for NVIDIA '
        'operand images (gpu-operator testenv); not NVIDIA software"\n'
        "USER 0:0\n"
        "COPY bin/ /usr/local/bin/\n"
        f"COPY {STUB_CONTEXT}/ {STUB_ARTEFACTS}/\n"
        f"ENV GPU_OPERATOR_STUB_ARTEFACTS={STUB_ARTEFACTS}\n"
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
        entrypoint = json.dumps(list(standin.entrypoint))
        print(f"{standin.reference}\t{entrypoint}\t{' '.join(standin.env)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
