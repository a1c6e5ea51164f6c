"""Locations tests read: the repository and NVIDIA's reference documents beside it."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NVIDIA_REFERENCE = REPO.parent / "shared" / "reference" / "nvidia"
CRD_FILE = REPO / "crds" / "clusterpolicy.yaml"
