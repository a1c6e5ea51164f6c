"""Command line: ``gpu-operator render | crd | ...``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import yaml

from gpu_operator.api.crd import clusterpolicy_crd


def dump_yaml(docs: Sequence[object]) -> str:
    """Multi-document YAML, block style, keys in the order they were built."""
    return yaml.safe_dump_all(docs, sort_keys=False, default_flow_style=False, width=100)


def _cmd_crd(args: argparse.Namespace) -> int:
    sys.stdout.write(dump_yaml([clusterpolicy_crd()]))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpu-operator", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    crd = sub.add_parser("crd", help="print the ClusterPolicy CustomResourceDefinition")
    crd.set_defaults(func=_cmd_crd)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
