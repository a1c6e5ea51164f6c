"""The user's ConfigMaps a ClusterPolicy names: which they are, what rendering learns from them,
and the references that point at nothing in them.

The controller reads them from the operator's namespace (a content hash that rolls the pods
mounting them, whether a device-plugin config shares GPUs with MPS, their file names);
``gpu-operator render`` learns the same from the ConfigMaps in its file, and checks the choices
the policy makes in them, which would otherwise fail only on the nodes: a device-plugin
``config.default`` that is not one of the ConfigMap's keys, a MIG ``config.default`` that is
not one of its ``mig-configs`` (``all-disabled`` when the policy names none).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from gpu_operator.api.spec import ClusterPolicySpec
from gpu_operator.render import config_hash
from gpu_operator.render.facts import mps_configured

MIG_CONFIG_KEY = "config.yaml"  # the file the MIG manager reads (CONFIG_FILE)
DEFAULT_MIG_CONFIG = "all-disabled"  # the layout of nodes without the mig.config label


def referenced_configmaps(spec: ClusterPolicySpec) -> tuple[str, ...]:
    """User ConfigMaps whose content shapes operand pods (edits must roll those pods)."""
    names = []
    refs = (
        spec.device_plugin.config,
        spec.mig_manager.config,
        spec.mig_manager.gpu_clients_config,
        spec.dcgm_exporter.config,
        spec.vgpu_device_manager.config,
    )
    for ref in refs:
        if ref is not None and ref.name:
            names.append(ref.name)
    return tuple(names)


@dataclass(frozen=True)
class ConfigFacts:
    """What rendering learns from ConfigMaps: the inputs of ``Facts`` the controller fills."""

    hashes: Mapping[str, str]
    mps: frozenset[str]
    keys: Mapping[str, tuple[str, ...]]


def config_facts(configmaps: Sequence[Mapping[str, Any]]) -> ConfigFacts:
    """The content hash, MPS sharing and file names of each ConfigMap, by name."""
    hashes, mps, keys = {}, set(), {}
    for cm in configmaps:
        name = cm["metadata"]["name"]
        data = cm.get("data") or {}
        hashes[name] = config_hash(cm)
        if mps_configured(data):
            mps.add(name)
        keys[name] = tuple(sorted({*data, *(cm.get("binaryData") or {})}))
    return ConfigFacts(hashes, frozenset(mps), keys)


def reference_problems(
    spec: ClusterPolicySpec, configmaps: Mapping[str, Mapping[str, Any]]
) -> list[str]:
    """Each default the policy picks in a ConfigMap of ``configmaps`` (by name) that it lacks,
    one line naming the field and the choices there are."""
    problems = []
    plugin = spec.device_plugin.config
    if plugin is not None and plugin.name and plugin.name in configmaps and plugin.default:
        data = configmaps[plugin.name].get("data") or {}
        if plugin.default not in data:
            problems.append(
                f"spec.devicePlugin.config.default: {plugin.default!r} is not a key of ConfigMap "
                f"{plugin.name} (its keys: {', '.join(sorted(data)) or 'none'}): name one of them"
            )
    mig = spec.mig_manager.config
    if mig is not None and mig.name and mig.name in configmaps:
        where = f"ConfigMap {mig.name}"
        layouts = _mig_layouts(configmaps[mig.name])
        if layouts is None:
            problems.append(
                f"spec.migManager.config.name: {where} has no {MIG_CONFIG_KEY} with a "
                "mig-configs map (the MIG manager reads that file): add it, or name another"
            )
        elif (default := DEFAULT_MIG_CONFIG if mig.default is None else mig.default) and (
            default not in layouts
        ):
            problems.append(
                f"spec.migManager.config.default: {default!r} is not in the mig-configs of "
                f"{where} (it has: {', '.join(sorted(layouts)) or 'none'}): add it there"
            )
    return problems


def _mig_layouts(configmap: Mapping[str, Any]) -> set[str] | None:
    text = (configmap.get("data") or {}).get(MIG_CONFIG_KEY)
    try:
        doc = yaml.safe_load(text) if isinstance(text, str) else None
    except yaml.YAMLError:
        return None
    layouts = doc.get("mig-configs") if isinstance(doc, dict) else None
    return {str(k) for k in layouts} if isinstance(layouts, dict) else None
