"""What the renderer needs to know about the cluster, beyond the ClusterPolicy.

The controller observes these (node OS labels, runtime, its own image and env) and passes them
in, so ``render`` stays a pure function of (policy, facts).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Literal

import yaml

DEFAULT_OPERATOR_IMAGE = "ghcr.io/gpu-operator/gpu-operator:v0.1.0"
"""The project's one image (operator and node agents); the single place it is spelt."""

Runtime = Literal["containerd", "crio", "docker"]

# Distributions whose driver images are tagged by major version only (rhel9, not rhel9.4).
_MAJOR_ONLY = frozenset({"rhel", "rocky", "ol", "centos", "almalinux"})


@dataclass(frozen=True, order=True)
class NodeOS:
    """A GPU node's OS, from the NFD labels ``system-os_release.ID`` / ``.VERSION_ID``."""

    id: str
    version_id: str

    @property
    def tag(self) -> str:
        """Driver image suffix: ``ubuntu22.04``; RHEL-family distributions use ``rhel9``."""
        version = self.version_id.split(".")[0] if self.id in _MAJOR_ONLY else self.version_id
        return f"{self.id}{version}"

    @classmethod
    def parse(cls, text: str) -> NodeOS:
        """``ubuntu22.04`` -> NodeOS("ubuntu", "22.04"): the id is the leading letters."""
        match = re.fullmatch(r"([a-z]+)([0-9][0-9.]*)", text.strip().lower())
        if match is None:
            raise ValueError(f"not an OS such as ubuntu22.04 or rhel9.4: {text!r}")
        return cls(match.group(1), match.group(2))


class FrozenMap(Mapping[str, str]):
    """A read-only, hashable str->str mapping, so ``Facts`` can be hashed and compared."""

    __slots__ = ("_data",)

    def __init__(self, items: Mapping[str, str] | Iterable[tuple[str, str]] = ()) -> None:
        self._data: dict[str, str] = dict(items)

    def __getitem__(self, key: str) -> str:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __hash__(self) -> int:
        return hash(frozenset(self._data.items()))

    def __repr__(self) -> str:
        return f"FrozenMap({self._data!r})"


@dataclass(frozen=True)
class Facts:
    """Cluster facts that shape the rendered objects. Plain dicts are accepted for the maps."""

    namespace: str = "gpu-operator"
    runtime: Runtime = "containerd"
    node_oses: tuple[NodeOS, ...] = (NodeOS("ubuntu", "22.04"),)
    openshift: bool = False
    operator_image: str = DEFAULT_OPERATOR_IMAGE
    # The operator Deployment's fallback image env (DRIVER_IMAGE, GFD_IMAGE, ...).
    image_env: Mapping[str, str] = field(default_factory=FrozenMap)
    # ConfigMap name -> content hash; a change rolls the pods that mount that ConfigMap.
    config_hashes: Mapping[str, str] = field(default_factory=FrozenMap)
    # ConfigMaps holding a device-plugin config that shares GPUs with MPS: the MPS control
    # daemon is rendered only for those (see ``mps_configured``).
    mps_configs: frozenset[str] = frozenset()
    # Explicitly simulated GPUs (a GPU_OPERATOR_SIMULATE value, e.g. ``a100-40gb:8``): the
    # project's agents are told to use simulated NVML. None (the default) on real clusters.
    simulate_gpus: str | None = None
    # The ClusterPolicy's driver shares the nodes with NVIDIADriver pools and keeps to nodes
    # without a pool label: with driver.useNvidiaDriverCRD, while some are still to be handed
    # over to a pool; without it, while pools give nodes back (and after, see handback_pending).
    driver_handover: bool = False
    # ConfigMap name -> its keys (file names), for config mounted one file each.
    configmap_keys: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "node_oses", tuple(self.node_oses))
        object.__setattr__(self, "image_env", FrozenMap(self.image_env))
        object.__setattr__(self, "config_hashes", FrozenMap(self.config_hashes))
        object.__setattr__(self, "mps_configs", frozenset(self.mps_configs))


def mps_configured(data: Mapping[str, str]) -> bool:
    """Whether any device-plugin config in a ConfigMap's ``data`` shares GPUs with MPS.

    Only ``sharing.mps`` is looked at (the device plugin validates the rest when it loads the
    config); text that is not YAML counts as no MPS.
    """
    for text in data.values():
        if "mps" not in text:
            continue
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError:
            continue
        sharing = doc.get("sharing") if isinstance(doc, dict) else None
        if isinstance(sharing, dict) and sharing.get("mps"):
            return True
    return False
