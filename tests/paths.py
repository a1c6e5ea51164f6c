"""Locations in the repository that tests read (NVIDIA's documents: tests/prerequisites.py)."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CRD_FILE = REPO / "crds" / "clusterpolicy.yaml"
