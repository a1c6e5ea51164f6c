"""Print how two CDI specs for one driver root differ (see compare-nvidia-ctk.sh)."""

from __future__ import annotations

import json
import sys
from typing import Any


def summary(spec: dict[str, Any], root: str) -> dict[str, Any]:
    common = spec.get("containerEdits") or {}
    return {
        "device edits": {
            d["name"]: sorted(n["path"] for n in d["containerEdits"].get("deviceNodes", ()))
            for d in spec["devices"]
        },
        "control nodes": sorted(n["path"] for n in common.get("deviceNodes", ())),
        "files": sorted({m["hostPath"].removeprefix(root) for m in common.get("mounts", ())}),
        "hooks": sorted({h["args"][1] for h in common.get("hooks", ()) if len(h["args"]) > 1}),
        "env": sorted(common.get("env") or ()),
    }


def main(style: str, root: str, theirs_path: str, ours_path: str) -> None:
    with open(theirs_path) as f:
        theirs = summary(json.load(f), root)
    with open(ours_path) as f:
        ours = summary(json.load(f), root)
    print(f"== {style}: {len(ours['files'])} files ours, {len(theirs['files'])} nvidia-ctk's")
    for key in theirs:
        if theirs[key] == ours[key]:
            print(f"  {key}: same")
        elif isinstance(ours[key], list):
            print(f"  {key}: only ours {sorted(set(ours[key]) - set(theirs[key]))}, "
                  f"only nvidia-ctk's {sorted(set(theirs[key]) - set(ours[key]))}")  # fmt: skip
        else:
            print(f"  {key}: ours {ours[key]}, nvidia-ctk's {theirs[key]}")


if __name__ == "__main__":
    main(*sys.argv[1:5])
