"""``python -m gpu_operator.sim.stubdriver build DIR``: the stub driver's artefacts, built (or
taken from the cache) and copied into DIR, for an image build context; prints the sources' hash
(what the artefacts are made from, so an image build can tell when they changed)."""

from __future__ import annotations

import shutil
import sys

from .build import build_stubs, source_hash
from .table import StubDriverError


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "build":
        print("usage: python -m gpu_operator.sim.stubdriver build DIR", file=sys.stderr)
        return 2
    try:
        built = build_stubs()
    except StubDriverError as exc:
        print(f"stub driver: {exc}", file=sys.stderr)
        return 1
    shutil.copytree(built, argv[1], dirs_exist_ok=True)
    print(source_hash())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
