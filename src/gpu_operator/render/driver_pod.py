"""The containers and volumes of a driver pod: the driver itself, the k8s-driver-manager init
container, the nvidia-peermem, nvidia-fs and gdrcopy side containers, and every ConfigMap or
Secret the spec names, mounted where NVIDIA's images read them."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from gpu_operator.api.nvidiadriver import NVIDIADriverSpec, SideContainer
from gpu_operator.render.driver_pool import (
    CERT_DIRS,
    DEFAULT_MANAGER,
    GRIDD_CONF,
    MANAGER_ENV_DEFAULTS,
    NLS_TOKEN,
    REPO_DIRS,
    STARTUP_PROBE,
    TOPOLOGY_CONF,
    ExtraConfig,
    Pool,
)
from gpu_operator.render.images import ImageDefault, resolve_image
from gpu_operator.render.wire import merge_env

# The driver container's readiness contract: the validators wait for this file. Our own script.
PROBE_SCRIPT = """#!/bin/sh
# Ready when nvidia-smi answers (it cannot without the kernel module); the validators and
# the side containers wait for the ready file, which lists what this driver enabled.
set -eu
dir=/run/nvidia/validations
mkdir -p "$dir"
status_file="$dir/.driver-daemons-status"
if [ -f "$status_file" ] && [ "$(cat "$status_file")" != Ready ]; then
  echo "driver daemons not ready: $(cat "$status_file")"; exit 1
fi
nvidia-smi >/dev/null || { echo "nvidia-smi failed: driver not loaded yet"; exit 1; }
printf 'GDRCOPY_ENABLED: %s\\nGDS_ENABLED: %s\\nGPU_DIRECT_RDMA_ENABLED: %s\\n' \\
  "${GDRCOPY_ENABLED:-false}" "${GDS_ENABLED:-false}" "${GPU_DIRECT_RDMA_ENABLED:-false}" \\
  > "$dir/.driver-ctr-ready.tmp"
mv "$dir/.driver-ctr-ready.tmp" "$dir/.driver-ctr-ready"
"""


def _env(name: str, value: str) -> dict[str, Any]:
    return {"name": name, "value": value}


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _host(name: str, path: str, type_: str | None = None) -> dict[str, Any]:
    source: dict[str, Any] = {"path": path}
    if type_:
        source["type"] = type_
    return {"name": name, "hostPath": source}


def _mount(name: str, path: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "mountPath": path, **extra}


def side_image(side: SideContainer, default: ImageDefault) -> str:
    return resolve_image(side, default, None)


def config_digest(value: object) -> str:
    """A short decimal digest (as NVIDIA's DRIVER_CONFIG_DIGEST) of what makes a driver pod."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    digest = 0x811C9DC5
    for byte in text.encode():
        digest = ((digest ^ byte) * 0x01000193) & 0xFFFFFFFF
    return str(digest)


def _configmap_files(
    volume: str, configmap: str, directory: str, keys: Sequence[str] | None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Mounts of each key of ``configmap`` into ``directory`` and the volume they read."""
    if not keys:
        return [_mount(volume, directory, readOnly=True)], {
            "name": volume,
            "configMap": {"name": configmap},
        }
    mounts = [
        _mount(volume, f"{directory}/{key}", readOnly=True, subPath=key) for key in sorted(keys)
    ]
    items = [{"key": key, "path": key} for key in sorted(keys)]
    return mounts, {"name": volume, "configMap": {"name": configmap, "items": items}}


def additional_configs(
    spec: NVIDIADriverSpec, pool: Pool, extra: ExtraConfig
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The config volumes of the driver container: repoConfig, certConfig (not for precompiled
    drivers, which install no packages), kernelModuleConfig, licensing and topology."""
    mounts: list[dict[str, Any]] = []
    volumes: list[dict[str, Any]] = []

    def add_configmap(volume: str, name: str, directory: str, usual: Sequence[str] = ()) -> None:
        keys = extra.configmap_keys.get(name) or usual
        more, vol = _configmap_files(volume, name, directory, keys)
        mounts.extend(more)
        volumes.append(vol)

    if not spec.use_precompiled:
        if spec.repo_config and spec.repo_config.name:
            add_configmap("repo-config", spec.repo_config.name, _dir(REPO_DIRS, pool, "repo"))
        if spec.cert_config and spec.cert_config.name:
            add_configmap("cert-config", spec.cert_config.name, _dir(CERT_DIRS, pool, "cert"))
    if spec.kernel_module_config and spec.kernel_module_config.name:
        # Not seen yet: its usual file, never the whole of /drivers (the driver lives there).
        add_configmap(
            "kernel-module-config", spec.kernel_module_config.name, "/drivers", ("nvidia.conf",)
        )
    licensing = spec.licensing_config
    if licensing and (licensing.secret_name or licensing.name):
        items = [{"key": GRIDD_CONF, "path": GRIDD_CONF}]
        mounts.append(
            _mount("licensing-config", f"/drivers/{GRIDD_CONF}", readOnly=True, subPath=GRIDD_CONF)
        )
        if licensing.nls_enabled is not False:
            items.append({"key": NLS_TOKEN, "path": NLS_TOKEN})
            mounts.append(
                _mount(
                    "licensing-config",
                    f"/drivers/ClientConfigToken/{NLS_TOKEN}",
                    readOnly=True,
                    subPath=NLS_TOKEN,
                )
            )
        source: dict[str, Any] = (
            {"secret": {"secretName": licensing.secret_name, "items": items}}
            if licensing.secret_name
            else {"configMap": {"name": licensing.name, "items": items}}
        )
        volumes.append({"name": "licensing-config", **source})
    topology = spec.virtual_topology_config
    if topology and topology.name:
        mounts.append(
            _mount(
                "topology-config",
                f"/etc/nvidia/{TOPOLOGY_CONF}",
                readOnly=True,
                subPath=TOPOLOGY_CONF,
            )
        )
        volumes.append(
            {
                "name": "topology-config",
                "configMap": {
                    "name": topology.name,
                    "items": [{"key": TOPOLOGY_CONF, "path": TOPOLOGY_CONF}],
                },
            }
        )
    return mounts, volumes


def _dir(table: Mapping[str, str], pool: Pool, what: str) -> str:
    try:
        return table[pool.os_id]
    except KeyError:
        raise ValueError(
            f"{what}Config: no known {what} directory for {pool.os_id} nodes; "
            f"supported: {', '.join(sorted(table))}"
        ) from None


def _probe(spec_probe: Any, defaults: Mapping[str, int]) -> dict[str, Any]:
    return {**defaults, **(spec_probe.to_wire() if spec_probe is not None else {})}


def driver_container(
    spec: NVIDIADriverSpec,
    pool: Pool,
    image: str,
    extra: ExtraConfig,
    config_mounts: list[dict[str, Any]],
    digest: str,
) -> dict[str, Any]:
    host_manager = spec.driver_type == "vgpu-host-manager"
    rdma = bool(spec.rdma and spec.rdma.enabled)
    env = [
        _env("NVIDIA_VISIBLE_DEVICES", "void"),
        _field_env("NODE_NAME", "spec.nodeName"),
        _field_env("NODE_IP", "status.hostIP"),
        _env("DRIVER_CONFIG_DIGEST", digest),
    ]
    if spec.gds and spec.gds.enabled:
        env.append(_env("GDS_ENABLED", "true"))
    if spec.gdrcopy and spec.gdrcopy.enabled:
        env.append(_env("GDRCOPY_ENABLED", "true"))
    if rdma:
        env.append(_env("GPU_DIRECT_RDMA_ENABLED", "true"))
        if spec.rdma and spec.rdma.use_host_mofed:
            env.append(_env("USE_HOST_MOFED", "true"))
    if spec.kernel_module_type and spec.kernel_module_type != "auto":
        env.append(_env("KERNEL_MODULE_TYPE", spec.kernel_module_type))
    if spec.licensing_config and spec.licensing_config.nls_enabled is not None:
        env.append(_env("NLS_ENABLED", str(spec.licensing_config.nls_enabled).lower()))
    user_env = [e.to_wire() for e in spec.env or []]
    container: dict[str, Any] = {
        "name": "nvidia-driver-ctr",
        "image": image,
        "imagePullPolicy": spec.image_pull_policy or "IfNotPresent",
        "command": ["nvidia-driver"],
        "args": ["init", *(spec.args or [])],
        "env": merge_env(env, user_env),
        "securityContext": {"privileged": True, "seLinuxOptions": {"level": "s0"}},
    }
    if spec.secret_env:
        container["envFrom"] = [{"secretRef": {"name": spec.secret_env}}]
    if spec.resources is not None and spec.resources.to_wire():
        container["resources"] = spec.resources.to_wire()
    if not host_manager:
        container["lifecycle"] = {
            "preStop": {
                "exec": {
                    "command": [
                        "/bin/sh",
                        "-c",
                        "rm -f /run/nvidia/validations/.driver-ctr-ready "
                        "/run/nvidia/validations/.driver-daemons-status",
                    ]
                }
            }
        }
        container["startupProbe"] = {
            "exec": {"command": ["sh", "/usr/local/bin/startup-probe.sh"]},
            **_probe(spec.startup_probe, STARTUP_PROBE),
        }
    mounts = [
        _mount("run-nvidia", "/run/nvidia", mountPropagation="Bidirectional"),
        _mount("run-nvidia-fabricmanager", "/run/nvidia-fabricmanager"),
        _mount("run-nvidia-topologyd", "/run/nvidia-topologyd"),
        _mount("var-log", "/var/log"),
        _mount("dev-log", "/dev/log"),
        _mount("host-os-release", "/host-etc/os-release", readOnly=True),
        _mount(
            "mlnx-ofed-usr-src", "/run/mellanox/drivers/usr/src", mountPropagation="HostToContainer"
        ),
        _mount("run-mellanox-drivers", "/run/mellanox/drivers", mountPropagation="HostToContainer"),
        _mount("firmware-search-path", "/sys/module/firmware_class/parameters/path"),
        _mount("host-sys-devices-system", "/sys/devices/system"),
        _mount("nv-firmware", "/lib/firmware"),
    ]
    if host_manager:
        mounts += [_mount("cgroup", "/sys/fs/cgroup"), _mount("vfio", "/dev/vfio")]
    mounts.append(
        _mount(
            "driver-startup-probe-script",
            "/usr/local/bin/startup-probe.sh",
            subPath="startup-probe.sh",
        )
    )
    container["volumeMounts"] = [*mounts, *config_mounts, *extra.mounts]
    return container


def peermem_container(spec: NVIDIADriverSpec, image: str) -> dict[str, Any]:
    """nvidia-peermem, the GPUDirect RDMA module, loaded once the driver is."""
    host_mofed = bool(spec.rdma and spec.rdma.use_host_mofed)
    return {
        "name": "nvidia-peermem-ctr",
        "image": image,
        "imagePullPolicy": spec.image_pull_policy or "IfNotPresent",
        "command": ["nvidia-driver"],
        "args": ["reload_nvidia_peermem"],
        "env": [_env("USE_HOST_MOFED", str(host_mofed).lower())],
        "securityContext": {"privileged": True, "seLinuxOptions": {"level": "s0"}},
        "startupProbe": {
            "exec": {"command": ["sh", "-c", "lsmod | grep nvidia_peermem"]},
            "initialDelaySeconds": 10,
            "failureThreshold": 120,
            "successThreshold": 1,
            "periodSeconds": 10,
            "timeoutSeconds": 10,
        },
        "volumeMounts": [
            _mount("run-nvidia", "/run/nvidia", mountPropagation="Bidirectional"),
            _mount("var-log", "/var/log"),
            _mount("dev-log", "/dev/log", readOnly=True),
            _mount(
                "run-mellanox-drivers", "/run/mellanox/drivers", mountPropagation="HostToContainer"
            ),
        ],
    }


def side_container(
    name: str,
    side: SideContainer,
    image: str,
    program: str,
    module: str,
    extra: ExtraConfig,
    resources: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """GDS (nvidia-fs) and GDRCopy (gdrdrv): wait for the driver, then install the module."""
    wait = (
        "until [ -d /run/nvidia/driver/usr/src ] && lsmod | grep nvidia; do echo  Waiting "
        f"for nvidia-driver to be installed...; sleep 10; done; exec {program} install"
    )
    container: dict[str, Any] = {
        "name": name,
        "image": image,
        "imagePullPolicy": side.image_pull_policy or "IfNotPresent",
        "command": ["bash", "-xc"],
        "args": [wait, *(side.args or [])],
        "securityContext": {"privileged": True, "seLinuxOptions": {"level": "s0"}},
        "startupProbe": {
            "exec": {"command": ["sh", "-c", f"lsmod | grep {module}"]},
            "initialDelaySeconds": 10,
            "failureThreshold": 120,
            "successThreshold": 1,
            "periodSeconds": 10,
            "timeoutSeconds": 10,
        },
        "volumeMounts": [
            _mount("run-nvidia", "/run/nvidia", mountPropagation="HostToContainer"),
            _mount("var-log", "/var/log"),
            _mount("dev-log", "/dev/log", readOnly=True),
            *extra.mounts,
        ],
    }
    if side.env:
        container["env"] = [e.to_wire() for e in side.env]
    if resources:
        container["resources"] = dict(resources)
    return container


def manager_container(spec: NVIDIADriverSpec, extra: ExtraConfig, digest: str) -> dict[str, Any]:
    manager = spec.manager
    image = resolve_image(manager, DEFAULT_MANAGER, extra.image_env.get("DRIVER_MANAGER_IMAGE"))
    env = [
        _field_env("NODE_NAME", "spec.nodeName"),
        _env("NVIDIA_VISIBLE_DEVICES", "void"),
        *(_env(k, v) for k, v in MANAGER_ENV_DEFAULTS),
        _field_env("OPERATOR_NAMESPACE", "metadata.namespace"),
        _env("DRIVER_CONFIG_DIGEST", digest),
    ]
    container: dict[str, Any] = {
        "name": "k8s-driver-manager",
        "image": image,
        "imagePullPolicy": (manager.image_pull_policy if manager else None) or "IfNotPresent",
        "command": ["driver-manager"],
        "args": ["uninstall_driver"],
        "env": merge_env(env, [e.to_wire() for e in (manager.env if manager else None) or []]),
        "securityContext": {"privileged": True},
        "volumeMounts": [
            _mount("run-nvidia", "/run/nvidia", mountPropagation="Bidirectional"),
            _mount("host-root", "/host", mountPropagation="HostToContainer", readOnly=True),
            _mount("host-sys", "/sys"),
            _mount(
                "run-mellanox-drivers", "/run/mellanox/drivers", mountPropagation="HostToContainer"
            ),
        ],
    }
    if spec.resources is not None and spec.resources.to_wire():
        container["resources"] = spec.resources.to_wire()
    return container


def driver_volumes(
    spec: NVIDIADriverSpec, host_manager: bool, probe_cm: str
) -> list[dict[str, Any]]:
    volumes = [
        _host("run-nvidia", "/run/nvidia", "DirectoryOrCreate"),
        _host("var-log", "/var/log"),
        _host("dev-log", "/dev/log"),
        _host("host-os-release", "/etc/os-release"),
        _host("run-nvidia-fabricmanager", "/run/nvidia-fabricmanager", "DirectoryOrCreate"),
        _host("run-nvidia-topologyd", "/run/nvidia-topologyd", "DirectoryOrCreate"),
        _host("mlnx-ofed-usr-src", "/run/mellanox/drivers/usr/src", "DirectoryOrCreate"),
        _host("run-mellanox-drivers", "/run/mellanox/drivers", "DirectoryOrCreate"),
        _host("run-nvidia-validations", "/run/nvidia/validations", "DirectoryOrCreate"),
        _host("host-root", "/"),
        _host("host-sys", "/sys", "Directory"),
        _host("firmware-search-path", "/sys/module/firmware_class/parameters/path"),
        _host("host-sys-devices-system", "/sys/devices/system", "Directory"),
        _host("nv-firmware", "/run/nvidia/driver/lib/firmware", "DirectoryOrCreate"),
    ]
    if host_manager:
        volumes += [_host("cgroup", "/sys/fs/cgroup"), _host("vfio", "/dev/vfio")]
    volumes.append(
        {
            "name": "driver-startup-probe-script",
            "configMap": {"name": probe_cm, "defaultMode": 0o755},
        }
    )
    return volumes
