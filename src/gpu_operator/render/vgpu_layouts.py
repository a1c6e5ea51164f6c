"""NVIDIA's default vGPU device layouts: the content of ``default-vgpu-devices-config``, the
ConfigMap the vGPU device manager reads where ``vgpuDeviceManager.config.name`` names none.

A node's ``nvidia.com/vgpu.config`` label picks a layout by name. There is one per vGPU type,
which puts on every GPU of the node as many devices of that type as fit on one GPU, and
``default`` (what a node without the label gets): per GPU model, by PCI device id, two devices
of a type half the GPU's size (one on the largest GPUs). The names and counts are NVIDIA's
(gpu-operator's vGPU device manager ConfigMap); a type is ``<board>-<size>``, the size its
framebuffer in GB and series (Q virtual workstation, C compute), MIG-backed ones
``<compute slices>-<GB>C`` (``CME``: with the media engines). Boards with the same framebuffer
offer the same types, so the tables below are per framebuffer.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import yaml

Sizes = Mapping[str, int]  # the part of a vGPU type after its board -> devices per GPU


def _mig(one: int, two: int, four: int, eight: int) -> dict[str, int]:
    """The MIG-backed types of a GPU of 7 compute and 8 memory slices, whose 1, 2, 4 and 8
    memory slices hold ``one``, ``two``, ``four`` and ``eight`` GB, each with the most that
    fit (the profiles of gpu-facts' MIG tables: 1g, 1g+me, 1g of 2 slices, 2g, 3g, 4g, 7g)."""
    return {
        f"1-{one}C": 7,
        f"1-{one}CME": 1,
        f"1-{two}C": 4,
        f"2-{two}C": 3,
        f"3-{four}C": 2,
        f"4-{four}C": 1,
        f"7-{eight}C": 1,
    }


_GB16: Sizes = {"1Q": 16, "2Q": 8, "4C": 4, "4Q": 4, "8C": 2, "8Q": 2, "16C": 1, "16Q": 1}
_GB24: Sizes = {
    **{"1Q": 24, "2Q": 12, "3Q": 8, "4C": 6, "4Q": 6, "6C": 4, "6Q": 4},
    **{"8C": 3, "8Q": 3, "12C": 2, "12Q": 2, "24C": 1, "24Q": 1},
}
_GB32: Sizes = {
    **{"1Q": 32, "2Q": 16, "4C": 8, "4Q": 8, "8C": 4, "8Q": 4},
    **{"16C": 2, "16Q": 2, "32C": 1, "32Q": 1},
}
_GB48: Sizes = {
    **{"1Q": 32, "2Q": 24, "3Q": 16, "4C": 12, "4Q": 12, "6C": 8, "6Q": 8, "8C": 6, "8Q": 6},
    **{"12C": 4, "12Q": 4, "16C": 3, "16Q": 3, "24C": 2, "24Q": 2, "48C": 1, "48Q": 1},
}
_A30: Sizes = {
    **{"1-6C": 4, "1-6CME": 1, "2-12C": 2, "2-12CME": 1, "4-24C": 1},
    **{"4C": 6, "6C": 4, "8C": 3, "12C": 2, "24C": 1},
}
_A100_40GB: Sizes = {
    **_mig(5, 10, 20, 40),
    **{"4C": 10, "5C": 8, "8C": 5, "10C": 4, "20C": 2, "40C": 1},
}
_A100_80GB: Sizes = {
    **_mig(10, 20, 40, 80),
    **{"4C": 20, "8C": 10, "10C": 8, "16C": 5, "20C": 4, "40C": 2, "80C": 1},
}
_H100_64GB: Sizes = {**_mig(8, 16, 32, 64), **{"4C": 16, "8C": 8, "16C": 4, "32C": 2, "64C": 1}}
_H100_80GB: Sizes = {**_A100_80GB, "5C": 16}
_H100_94GB: Sizes = {
    **_mig(12, 24, 47, 94),
    **{"4C": 23, "6C": 15, "11C": 8, "15C": 6, "23C": 4, "47C": 2, "94C": 1},
}
_H20_96GB: Sizes = {
    **_mig(12, 24, 48, 96),
    **{"4C": 24, "6C": 16, "8C": 12, "12C": 8, "16C": 6, "24C": 4, "32C": 3, "48C": 2, "96C": 1},
}
_H200_141GB: Sizes = {
    **_mig(18, 35, 71, 141),
    **{"4C": 32, "7C": 20, "8C": 16, "14C": 10, "17C": 8, "28C": 5, "35C": 4, "70C": 2},
    "141C": 1,
}
_DC_96GB: Sizes = {
    **{"1-2Q": 48, "1-3Q": 32, "1-4Q": 24, "1-6Q": 16, "1-8C": 12, "1-8Q": 12, "1-12C": 8},
    **{"1-12Q": 8, "1-24C": 4, "1-24Q": 4, "2-12C": 8, "2-12Q": 8, "2-16C": 6, "2-16Q": 6},
    **{"2-24C": 4, "2-24Q": 4, "2-48C": 2, "2-48Q": 2, "4-24C": 4, "4-24Q": 4, "4-32C": 3},
    **{"4-32Q": 3, "4-48C": 2, "4-48Q": 2, "4-96C": 1, "4-96Q": 1, "3Q": 32, "4Q": 24},
    **{"6Q": 16, "8C": 12, "8Q": 12, "12C": 8, "12Q": 8, "16C": 6, "16Q": 6, "24C": 4},
    **{"24Q": 4, "32C": 3, "32Q": 3, "48C": 2, "48Q": 2, "96C": 1, "96Q": 1},
}

# Every board's vGPU types.
BOARDS: Mapping[str, Sizes] = {
    "6000D": {"1-42C": 2, "1-42Q": 2, "2-84C": 1, "2-84Q": 1, "84C": 1, "84Q": 1},
    "A2": _GB16,
    "A10": _GB24,
    "A16": _GB16,
    "A30": _A30,
    "A40": _GB48,
    "A100D": _A100_80GB,
    "A100DX": _A100_80GB,
    "A100X": _A100_40GB,
    "A100": _A100_40GB,
    "A800D": _A100_80GB,
    "A800DX": _A100_80GB,
    "A800": _A100_40GB,
    "B200X": {**_mig(23, 45, 90, 180), "180C": 1},
    "DC": _DC_96GB,
    "GB200": {**_mig(24, 47, 95, 189), "189C": 1},
    "GH200L": {**_mig(18, 36, 72, 144), "144C": 1},
    "GH200": {**_mig(12, 24, 48, 96), "96C": 1},
    "H20X": _H200_141GB,
    "H20": _H20_96GB,
    "H100L": _H100_94GB,
    "H100XL": _H100_94GB,
    "H100XM": _H100_80GB,
    "H100XS": _H100_64GB,
    "H100": _H100_80GB,
    "H200X": _H200_141GB,
    "H200": _H200_141GB,
    "H800L": _H100_94GB,
    "H800XM": _H100_80GB,
    "H800": _H100_80GB,
    "L2": _GB24,
    "L4": _GB24,
    "L20": _GB48,
    "L40S": _GB48,
    "L40": _GB48,
    "RTX5000-Ada": _GB32,
    "RTX5880-Ada": _GB48,
    "RTX6000P": _GB24,
    "RTX6000-Ada": _GB48,
    "RTX8000P": {**_GB48, "4C": 8},
    "RTXA5000": _GB24,
    "RTXA5500": _GB24,
    "RTXA6000": _GB48,
    "T4": _GB16,
    "V100D": _GB32,
    "V100DX": _GB32,
    "V100L": _GB16,
    "V100S": _GB32,
    "V100X": _GB16,
    "V100": _GB16,
}

# The ``default`` layout's type per GPU model (PCI device and vendor id, as device-filter reads
# it), in NVIDIA's order; some ids are listed twice, as NVIDIA lists them.
DEFAULTS: tuple[tuple[str, str], ...] = (
    ("0x1DB110DE", "V100X-8Q"),
    ("0x1DB310DE", "V100L-8Q"),
    ("0x1DB410DE", "V100-8Q"),
    ("0x1DB510DE", "V100DX-16Q"),
    ("0x1DB610DE", "V100D-16Q"),
    ("0x1DF610DE", "V100S-16Q"),
    ("0x1E7810DE", "RTX8000P-24Q"),
    ("0x1E7810DE", "RTX6000P-12Q"),
    ("0x1EB810DE", "T4-8Q"),
    ("0x20B010DE", "A100X-20C"),
    ("0x20B210DE", "A100DX-40C"),
    ("0x20B510DE", "A100D-40C"),
    ("0x20B810DE", "A100D-40C"),
    ("0x20B710DE", "A30-12C"),
    ("0x20B910DE", "A30-12C"),
    ("0x20F110DE", "A100-20C"),
    ("0x20F310DE", "A800DX-40C"),
    ("0x20F510DE", "A800D-40C"),
    ("0x20FD10DE", "A800D-40C"),
    ("0x20F610DE", "A800-20C"),
    ("0x223010DE", "RTXA6000-24Q"),
    ("0x223110DE", "RTXA5000-12Q"),
    ("0x223310DE", "RTXA5500-12Q"),
    ("0x223510DE", "A40-24Q"),
    ("0x223610DE", "A10-12Q"),
    ("0x232110DE", "H100L-47C"),
    ("0x232210DE", "H800-40C"),
    ("0x232410DE", "H800XM-40C"),
    ("0x232910DE", "H20-48C"),
    ("0x232C10DE", "H20X-70C"),
    ("0x233010DE", "H100XM-40C"),
    ("0x233610DE", "H100XM-40C"),
    ("0x233110DE", "H100-40C"),
    ("0x233510DE", "H200X-70C"),
    ("0x233710DE", "H100XS-32C"),
    ("0x233910DE", "H100XL-47C"),
    ("0x233A10DE", "H800L-47C"),
    ("0x233B10DE", "H200-70C"),
    ("0x234210DE", "GH200-96C"),
    ("0x234810DE", "GH200L-144C"),
    ("0x25B610DE", "A16-8Q"),
    ("0x25B610DE", "A2-8Q"),
    ("0x26B110DE", "RTX6000-Ada-24Q"),
    ("0x26B210DE", "RTX5000-Ada-16Q"),
    ("0x26B310DE", "RTX5880-Ada-24Q"),
    ("0x26B510DE", "L40-24Q"),
    ("0x26B910DE", "L40S-24Q"),
    ("0x26BA10DE", "L20-24Q"),
    ("0x27B610DE", "L2-12Q"),
    ("0x27B810DE", "L4-12Q"),
    ("0x290110DE", "B200X-180C"),
    ("0x294110DE", "GB200-189C"),
    ("0x2BB510DE", "DC-48Q"),
    ("0x2BB910DE", "6000D-84Q"),
)


def vgpu_types() -> dict[str, int]:
    """Every vGPU type, with how many devices of it fit on one GPU."""
    return {f"{board}-{size}": n for board, sizes in BOARDS.items() for size, n in sizes.items()}


@functools.cache
def default_layouts() -> str:
    """The vGPU device manager's config file (``version: v1``): a layout per type, then
    ``default``."""
    types = vgpu_types()
    configs: dict[str, Any] = {
        name: [{"devices": "all", "vgpu-devices": {name: n}}] for name, n in types.items()
    }
    configs["default"] = [
        {"device-filter": device, "devices": "all", "vgpu-devices": {name: types[name]}}
        for device, name in DEFAULTS
    ]
    return yaml.safe_dump({"version": "v1", "vgpu-configs": configs}, sort_keys=False)
