"""``gpu-operator migrate``: an old ClusterPolicy file rewritten for today's schema, as the user
wrote it everywhere else.

``legacy.migrate`` decides the new document, on plain data (read as ``render`` and kubectl read
YAML). Only the differences are then carried onto the file's round-trip tree (ruamel.yaml), so
every comment, the order of keys, quoting and indentation survive where nothing changed: a
migrated GitOps file stays reviewable as a small diff. A comment line that followed a removed
field is kept, after what now precedes it.
"""

from __future__ import annotations

import argparse
import difflib
import io
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import CommentMark, YAMLError
from ruamel.yaml.tokens import CommentToken

from gpu_operator.api import KIND, PolicyError, parse_document
from gpu_operator.api.legacy import migrate
from gpu_operator.formats import add_output_option
from gpu_operator.render.engine import SAFE_LOADER
from gpu_operator.textfiles import read_text, yaml_problem

Collection = CommentedMap | CommentedSeq
Slot = tuple[Collection, Any]  # a map and key, or a list and index: where a comment hangs


class MigrateError(Exception):
    """A file that cannot be migrated; reported on stderr with exit code 1."""


# -- comments that follow an entry: ruamel keeps the lines after an entry (up to the next one)
# on the entry's last scalar, so removing or appending an entry moves them to where they belong


def _tail(container: Collection, key: Any) -> Slot:
    """Where the comment after ``container[key]`` hangs: on its deepest last entry."""
    value = container[key]
    if isinstance(value, (CommentedMap, CommentedSeq)) and len(value):
        return _tail(value, list(value)[-1] if isinstance(value, CommentedMap) else len(value) - 1)
    return container, key


def _token_index(container: Collection) -> int:
    return 2 if isinstance(container, CommentedMap) else 0


def _take_lines(slot: Slot) -> str:
    """The comment lines after the entry at ``slot`` (not its own end-of-line comment)."""
    container, key = slot
    token = (container.ca.items.get(key) or [None] * 4)[_token_index(container)]
    if token is None or "\n" not in token.value:
        return ""
    own, lines = token.value.split("\n", 1)
    token.value = own + "\n"
    return str(lines)


def _give_lines(slot: Slot, lines: str) -> None:
    if not lines:
        return
    container, key = slot
    items = container.ca.items.setdefault(key, [None] * 4)
    index = _token_index(container)
    if items[index] is None:
        items[index] = CommentToken("\n", CommentMark(0))
    items[index].value += lines


def _detached(value: Any, removed: Sequence[tuple[Any, Any]]) -> Any:
    """``value`` as a round-trip node: the removed node it equals when it was moved (so its
    comments move with it), else new nodes on which comments can hang."""
    if isinstance(value, (Mapping, list)) and value:
        for plain, node in removed:
            if plain == value and isinstance(node, (CommentedMap, CommentedSeq)):
                return node
    if isinstance(value, Mapping):
        return CommentedMap((k, _detached(v, removed)) for k, v in value.items())
    if isinstance(value, list):
        return CommentedSeq(_detached(v, removed) for v in value)
    return value


# -- the differences between two plain documents, carried onto the tree


def apply_changes(tree: Any, old: Any, new: Any) -> Any:
    """``tree`` (the round-trip form of ``old``) changed as ``old`` became ``new``: what is the
    same stays as it was, with its comments and layout, and a subtree that moved keeps its
    comments too. Returns the node to keep in ``tree``'s place."""
    return _Changes(_removed(tree, old, new)).apply(tree, old, new, None)


def _removed(tree: Any, old: Any, new: Any) -> list[tuple[Any, Any]]:
    """Every entry of a map in ``old`` that ``new`` lacks: its plain value and its node."""
    if not (isinstance(tree, CommentedMap) and isinstance(old, Mapping)):
        return []
    new_map = new if isinstance(new, Mapping) else {}
    found = []
    for key, value in old.items():
        if key not in tree:
            continue
        if key in new_map:
            found += _removed(tree[key], value, new_map[key])
        else:
            found.append((value, tree[key]))
    return found


@dataclass
class _Changes:
    removed: list[tuple[Any, Any]]

    def apply(self, tree: Any, old: Any, new: Any, at: Slot | None) -> Any:
        """``at`` is where ``tree`` hangs in its parent."""
        if old == new:
            return tree
        if isinstance(tree, CommentedMap) and isinstance(old, Mapping) and isinstance(new, Mapping):
            self._map(tree, old, new, at)
            return tree
        if isinstance(tree, CommentedSeq) and isinstance(old, list) and isinstance(new, list):
            self._list(tree, old, new)
            return tree
        return _detached(new, self.removed)

    def _map(
        self, tree: CommentedMap, old: Mapping[Any, Any], new: Mapping[Any, Any], at: Slot | None
    ) -> None:
        pending = ""  # the lines after a map's only entry, removed: they follow the map
        for key in [k for k in old if k not in new and k in tree]:
            keys = list(tree)
            lines = _take_lines(_tail(tree, key))
            del tree[key]
            position = keys.index(key)
            if position > 0:  # after the entry before it
                _give_lines(_tail(tree, keys[position - 1]), lines)
            elif tree and at is not None:  # before the entry after it
                _give_lines(at, lines)
            else:
                pending += lines
        for key, value in new.items():
            if key in tree and key in old:
                tree[key] = self.apply(tree[key], old[key], value, (tree, key))
            elif key not in tree:  # appended: what followed the map follows it
                lines = _take_lines(_tail(tree, list(tree)[-1])) if tree else ""
                tree[key] = _detached(value, self.removed)
                _give_lines(_tail(tree, key), lines)
        if tree:
            _give_lines(_tail(tree, list(tree)[-1]), pending)
        elif old and at is not None:  # emptied: `{}` on its key's line, then the lines
            tree.fa.set_flow_style()
            _give_lines(at, pending)

    def _list(self, tree: CommentedSeq, old: Sequence[Any], new: Sequence[Any]) -> None:
        def text(items: Sequence[Any]) -> list[str]:
            return [json.dumps(item, sort_keys=True, default=str) for item in items]

        matcher = difflib.SequenceMatcher(a=text(old), b=text(new), autojunk=False)
        # From the end, so the indexes of what is still to change stay put.
        for op, i1, i2, j1, j2 in reversed(matcher.get_opcodes()):
            if op == "equal":
                continue
            paired = min(i2 - i1, j2 - j1)
            for offset in range(paired):
                i = i1 + offset
                tree[i] = self.apply(tree[i], old[i], new[j1 + offset], (tree, i))
            for i in reversed(range(i1 + paired, i2)):
                del tree[i]
            for offset, value in enumerate(new[j1 + paired : j2]):
                tree.insert(i1 + paired + offset, _detached(value, self.removed))


# -- the file


def indentation(text: str) -> tuple[int, int, int]:
    """The file's indentation as ruamel.yaml takes it: of mappings, of sequence items, and of
    their dash, from the first of each below a key (2, 2, 0 when there is none)."""
    mapping = sequence = offset = None
    parent: int | None = None  # the indent of a line holding only a key
    for line in text.splitlines():
        body = line.lstrip(" ")
        if not body or body.startswith("#"):
            continue
        indent = len(line) - len(body)
        if parent is not None and indent > parent:
            if body.startswith("- ") and sequence is None:
                offset = indent - parent
                sequence = offset + len(body) - len(body[1:].lstrip(" "))
            elif not body.startswith("-") and mapping is None:
                mapping = indent - parent
        parent = indent if body.rstrip().endswith(":") and not body.startswith("- ") else None
    return mapping or 2, sequence or (mapping or 2), offset or 0


def _round_trip_yaml(text: str) -> tuple[YAML, list[Any]]:
    """A round-trip YAML with the file's own indentation, and the file's documents."""
    rt = YAML()
    rt.preserve_quotes = True
    rt.width = 4096  # never fold a long line that was not folded
    mapping, sequence, offset = indentation(text)
    rt.indent(mapping=mapping, sequence=sequence, offset=offset)
    return rt, list(rt.load_all(text))


@dataclass(frozen=True)
class Migrated:
    text: str | None  # the file rewritten; None when nothing needed to change
    documents: list[Any]  # every document, as plain data, migrated
    notes: list[str]  # what was changed, one line each
    problems: list[str]  # what is still invalid, one line each


def migrate_file(text: str, path: str) -> Migrated:
    """Every ClusterPolicy of the file migrated; other documents as they are."""
    try:
        plain = list(yaml.load_all(text, Loader=SAFE_LOADER))
    except yaml.YAMLError as exc:
        raise MigrateError(f"{path}: {yaml_problem(exc)}") from None
    if all(doc is None for doc in plain):
        raise MigrateError(f"{path}: no document to migrate: expected {KIND} objects")
    out, notes, problems, changes = [], [], [], {}
    for number, doc in enumerate(plain):
        if not isinstance(doc, dict) or doc.get("kind") != KIND:
            out.append(doc)
            continue
        result = migrate(doc)
        name = (result.document.get("metadata") or {}).get("name", "?")
        notes += [f"{path}: {name}: {note}" for note in result.notes]
        try:
            parse_document(result.document)
        except PolicyError as exc:
            problems += [f"{path}: {name}: {p}" for p in exc.problems]
        if result.notes:
            changes[number] = result.document
        out.append(result.document)
    if not changes:
        return Migrated(None, out, notes, problems)
    try:
        rt, trees = _round_trip_yaml(text)
    except YAMLError as exc:  # what PyYAML lets pass: a duplicate key, say
        problem = " ".join(str(exc).split())
        raise MigrateError(f"{path}: cannot rewrite it in place: {problem}") from None
    for number, new in changes.items():
        trees[number] = apply_changes(trees[number], plain[number], new)
    stream = io.StringIO()
    rt.dump_all(trees, stream)
    return Migrated(stream.getvalue(), out, notes, problems)


def _fail(message: str) -> int:
    sys.stderr.write("".join(f"error: {line}\n" for line in message.splitlines()))
    return 1


def _cmd_migrate(args: argparse.Namespace) -> int:
    """Every ClusterPolicy in the file rewritten for today's schema; other documents as they are."""
    try:
        # A file that is not UTF-8 text raises a FileProblem naming it.
        text = sys.stdin.read() if args.file == "-" else read_text(args.file)
    except OSError as exc:
        return _fail(f"{args.file}: cannot read: {exc.strerror or exc}")
    try:
        migrated = migrate_file(text, args.file)
    except MigrateError as exc:
        return _fail(str(exc))
    sys.stderr.write("".join(f"{note}\n" for note in migrated.notes))
    if migrated.text is None:
        sys.stderr.write(f"{args.file}: nothing to migrate\n")
    docs = [d for d in migrated.documents if d is not None]
    if args.output == "json":
        body = docs[0] if len(docs) == 1 else {"apiVersion": "v1", "kind": "List", "items": docs}
        sys.stdout.write(json.dumps(body, indent=2) + "\n")
    else:
        sys.stdout.write(text if migrated.text is None else migrated.text)
    if migrated.problems:
        return _fail("\n".join(["still invalid after migration:", *migrated.problems]))
    return 0


def add_migrate_command(sub: Any) -> None:
    """Register ``migrate`` on the top-level subparsers."""
    migrate_cmd = sub.add_parser(
        "migrate",
        help="rewrite an old ClusterPolicy for today's schema",
        description="Print the file with every field NVIDIA moved or removed at its place today, "
        "its comments and layout kept (what changed goes to stderr, or `nothing to migrate`; "
        "exit 1 if something else is still invalid).",
    )
    migrate_cmd.add_argument("-f", "--file", required=True, help="YAML file, '-' for stdin")
    add_output_option(migrate_cmd, ("yaml", "json"), "yaml")
    migrate_cmd.set_defaults(func=_cmd_migrate)
