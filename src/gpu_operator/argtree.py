"""Walking an argparse tree, which argparse offers no public way to do: the parsers that run a
command (the leaves), so options every command shares are added, and checked, in one place."""

from __future__ import annotations

import argparse
from collections.abc import Iterator


def subcommands(
    parser: argparse.ArgumentParser,
) -> list[argparse._SubParsersAction[argparse.ArgumentParser]]:
    """The parser's sub-command actions (none for a leaf)."""
    return [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]


def leaves(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """Every parser under ``parser`` (itself included) that has no sub-commands."""
    actions = subcommands(parser)
    if not actions:
        yield parser
    for action in actions:
        for child in dict.fromkeys(action.choices.values()):  # aliases name a parser twice
            yield from leaves(child)
