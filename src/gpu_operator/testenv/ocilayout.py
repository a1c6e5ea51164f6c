"""Images that differ from one image in their config alone, named in one OCI image layout.

The stand-ins are one image, each given a name, an entrypoint, an environment and a title of
its own. Committing and pushing each took seconds apiece (a commit adds an empty layer, a push
reads every layer again); here each is a new config and manifest over the same layers, written
as JSON beside them, and the layout's index names them instead of the image they came from.

`python -m gpu_operator.testenv.ocilayout LAYOUT SOURCE_NAME LIST` reads the stand-ins' lines
from the file LIST, as `python -m gpu_operator.testenv.standins` prints them (name, entrypoint
as JSON, `KEY=value` words; tab-separated).
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .standins import SIMULATED_LABEL

REF_NAME = "org.opencontainers.image.ref.name"
TITLE = "org.opencontainers.image.title"


@dataclass(frozen=True)
class Variant:
    name: str  # the image reference it is named by, e.g. nvcr.io/nvidia/driver:580.95.05
    entrypoint: tuple[str, ...]
    env: tuple[str, ...] = ()  # `KEY=value`, replacing the image's own KEY
    title: str = ""


def parse_variants(lines: Iterable[str], title: str = "{name}") -> list[Variant]:
    """The stand-ins' lines; ``title`` is formatted with each one's name."""
    found = []
    for line in lines:
        if not line.strip():
            continue
        name, entrypoint, env = [*line.rstrip("\n").split("\t"), "", ""][:3]
        found.append(
            Variant(
                name,
                tuple(json.loads(entrypoint)),
                tuple(env.split()),
                title.format(name=name),
            )
        )
    return found


def with_env(env: Sequence[str], changes: Sequence[str]) -> list[str]:
    """``env`` with each of ``changes`` set (as `buildah config --env` sets it)."""
    merged = {kv.split("=", 1)[0]: kv for kv in env}
    for kv in changes:
        merged[kv.split("=", 1)[0]] = kv
    return list(merged.values())


def variant_config(config: dict[str, Any], variant: Variant) -> dict[str, Any]:
    """``config`` (an image config) as ``variant``'s: its entrypoint, no command, its env and
    title. The layers and their history stay the source's."""
    out: dict[str, Any] = json.loads(json.dumps(config))
    inner = out.setdefault("config", {})
    inner["Entrypoint"] = list(variant.entrypoint)
    inner.pop("Cmd", None)
    inner["Env"] = with_env(inner.get("Env") or [], variant.env)
    if variant.title:
        inner["Labels"] = {**(inner.get("Labels") or {}), TITLE: variant.title}
    return out


class Layout:
    """An OCI image layout directory (index.json, blobs/sha256/...)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.index: dict[str, Any] = json.loads((root / "index.json").read_text())

    def blob(self, digest: str) -> bytes:
        algorithm, value = digest.split(":", 1)
        return (self.root / "blobs" / algorithm / value).read_bytes()

    def put(self, data: bytes) -> str:
        value = hashlib.sha256(data).hexdigest()
        path = self.root / "blobs" / "sha256" / value
        if not path.exists():
            path.write_bytes(data)
        return f"sha256:{value}"

    def descriptor(self, name: str) -> dict[str, Any]:
        for entry in self.index["manifests"]:
            if (entry.get("annotations") or {}).get(REF_NAME) == name:
                return dict(entry)
        raise KeyError(f"{name} is not named in {self.root / 'index.json'}")

    def add_variants(self, source: str, variants: Iterable[Variant]) -> None:
        """Name each of ``variants`` in the layout, over ``source``'s layers; ``source``'s own
        name is taken off the index (its blobs stay: the variants share them)."""
        base = self.descriptor(source)
        manifest = json.loads(self.blob(base["digest"]))
        config = json.loads(self.blob(manifest["config"]["digest"]))
        entries = [
            e for e in self.index["manifests"] if e.get("annotations", {}).get(REF_NAME) != source
        ]
        for variant in variants:
            data = _canonical(variant_config(config, variant))
            own = {
                **manifest,
                "config": {**manifest["config"], "digest": self.put(data), "size": len(data)},
            }
            body = _canonical(own)
            entries = [e for e in entries if e.get("annotations", {}).get(REF_NAME) != variant.name]
            entries.append(
                {
                    "mediaType": base["mediaType"],
                    "digest": self.put(body),
                    "size": len(body),
                    "annotations": {REF_NAME: variant.name},
                }
            )
        self.index["manifests"] = entries
        (self.root / "index.json").write_bytes(_canonical(self.index))


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(
            "usage: python -m gpu_operator.testenv.ocilayout LAYOUT SOURCE_NAME LIST",
            file=sys.stderr,
        )
        return 2
    title = f"{SIMULATED_LABEL} stand-in for {{name}} (gpu-operator testenv)"
    lines = Path(argv[2]).read_text().splitlines()
    Layout(Path(argv[0])).add_variants(argv[1], parse_variants(lines, title))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
