"""Stand-ins named in one OCI layout: each its own config and manifest over the same layers."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from gpu_operator.testenv.ocilayout import (
    REF_NAME,
    TITLE,
    Layout,
    Variant,
    parse_variants,
    with_env,
)

SOURCE = "localhost/testenv/standins:latest"


def _blob(root: Path, data: bytes) -> dict[str, object]:
    digest = hashlib.sha256(data).hexdigest()
    (root / "blobs" / "sha256" / digest).write_bytes(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def _layout(root: Path) -> Path:
    (root / "blobs" / "sha256").mkdir(parents=True)
    layer = _blob(root, b"a layer")
    config = {
        "architecture": "amd64",
        "config": {
            "Env": ["PATH=/usr/bin", "DRIVER_VERSION=0"],
            "Entrypoint": ["gpu-operator"],
            "Cmd": ["run"],
            "Labels": {"org.opencontainers.image.version": "0.1.0"},
        },
        "rootfs": {"type": "layers", "diff_ids": ["sha256:x"]},
        "history": [{"created_by": "COPY"}],
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            **_blob(root, json.dumps(config).encode()),
        },
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", **layer}],
    }
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": manifest["mediaType"],
                **_blob(root, json.dumps(manifest).encode()),
                "annotations": {REF_NAME: SOURCE},
            }
        ],
    }
    (root / "index.json").write_text(json.dumps(index))
    return root


def test_each_variant_has_its_config_over_the_source_layers(tmp_path: Path) -> None:
    root = _layout(tmp_path / "layout")
    lines = [
        'nvcr.io/nvidia/driver:580.95.05\t["nvidia-driver", "init"]\tDRIVER_VERSION=580.95.05',
        'nvcr.io/nvidia/k8s-device-plugin:v0.17.4\t["nvidia-device-plugin"]\t',
    ]
    Layout(root).add_variants(SOURCE, parse_variants(lines, "stand-in for {name}"))

    layout = Layout(root)
    names = [m["annotations"][REF_NAME] for m in layout.index["manifests"]]
    assert names == ["nvcr.io/nvidia/driver:580.95.05", "nvcr.io/nvidia/k8s-device-plugin:v0.17.4"]
    source_layers = None
    for name in names:
        manifest = json.loads(layout.blob(layout.descriptor(name)["digest"]))
        config = json.loads(layout.blob(manifest["config"]["digest"]))
        assert manifest["config"]["size"] == len(layout.blob(manifest["config"]["digest"]))
        source_layers = source_layers or manifest["layers"]
        assert manifest["layers"] == source_layers  # shared, not copied
        inner = config["config"]
        assert "Cmd" not in inner
        assert inner["Labels"][TITLE] == f"stand-in for {name}"
        assert inner["Labels"]["org.opencontainers.image.version"] == "0.1.0"
        assert config["history"] == [{"created_by": "COPY"}]  # no layer added
    driver = json.loads(layout.blob(layout.descriptor(names[0])["digest"]))
    config = json.loads(layout.blob(driver["config"]["digest"]))["config"]
    assert config["Entrypoint"] == ["nvidia-driver", "init"]
    assert config["Env"] == ["PATH=/usr/bin", "DRIVER_VERSION=580.95.05"]


def test_a_name_given_twice_is_named_once(tmp_path: Path) -> None:
    root = _layout(tmp_path / "layout")
    twice = [Variant("a:1", ("x",)), Variant("a:1", ("y",))]
    Layout(root).add_variants(SOURCE, twice)
    layout = Layout(root)
    assert [m["annotations"][REF_NAME] for m in layout.index["manifests"]] == ["a:1"]
    manifest = json.loads(layout.blob(layout.descriptor("a:1")["digest"]))
    assert json.loads(layout.blob(manifest["config"]["digest"]))["config"]["Entrypoint"] == ["y"]


def test_env_is_set_as_buildah_config_sets_it() -> None:
    assert with_env(["A=1", "B=2"], ["B=3", "C=4"]) == ["A=1", "B=3", "C=4"]
