"""Kubernetes label selectors in their string form (``app=x,tier!=db,env in (a,b),!legacy``).

The upgrade policy carries ``podSelector`` as the string kubectl accepts; the planner must
match pods itself because it never talks to the API server.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

# Optional DNS-subdomain prefix, then a name of up to 63 characters.
_KEY = r"(?:[a-z0-9](?:[-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?"
_VALUE = r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_SET = re.compile(rf"^\s*({_KEY})\s+(in|notin)\s+\(([^)]*)\)\s*$")
_EQ = re.compile(rf"^\s*({_KEY})\s*(==|!=|=)\s*({_VALUE})\s*$")
_EXISTS = re.compile(rf"^\s*(!?)\s*({_KEY})\s*$")


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "in", "notin", "exists", "!exists"
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.op == "exists":
            return self.key in labels
        if self.op == "!exists":
            return self.key not in labels
        if self.op == "in":
            return self.key in labels and labels[self.key] in self.values
        # notin: as in Kubernetes, a missing key matches
        return labels.get(self.key) not in self.values


@dataclass(frozen=True)
class Selector:
    """All requirements must hold; the empty selector matches every pod, as in Kubernetes."""

    text: str
    requirements: tuple[Requirement, ...]

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)

    @classmethod
    def parse(cls, text: str) -> Selector:
        """Parse the kubectl selector syntax; ValueError names the part that is wrong."""
        return cls(text, tuple(_requirement(part) for part in _split(text)))


def _split(text: str) -> list[str]:
    """Split on commas outside parentheses (``a in (x,y),b`` is two requirements)."""
    parts: list[str] = []
    depth = 0
    current = ""
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    if len(parts) == 1 and not parts[0].strip():
        return []
    return parts


def _requirement(part: str) -> Requirement:
    if match := _SET.match(part):
        values = [v.strip() for v in match.group(3).split(",")]
        if not all(values) or any(not re.fullmatch(_VALUE, v) for v in values):
            raise ValueError(f"invalid values in label selector requirement {part.strip()!r}")
        return Requirement(match.group(1), match.group(2), frozenset(values))
    if match := _EQ.match(part):
        op = "notin" if match.group(2) == "!=" else "in"
        return Requirement(match.group(1), op, frozenset({match.group(3)}))
    if match := _EXISTS.match(part):
        return Requirement(match.group(2), "!exists" if match.group(1) else "exists")
    raise ValueError(f"invalid label selector requirement {part.strip()!r}")
