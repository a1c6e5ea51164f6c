"""Hypothesis strategies from a CRD's openAPIV3Schema: documents the API server would accept.

hypothesis-jsonschema does not read Kubernetes' structural-schema extensions
(``x-kubernetes-int-or-string``, ``x-kubernetes-preserve-unknown-fields``) and chokes on the
size of the ClusterPolicy schema, so this small converter covers exactly the keywords CRD
schemas use: type, properties, required, additionalProperties, items, enum, pattern,
min/maxLength, minimum/maximum and the two extensions. Each object gets a few of its optional
fields (``fields`` at most), so a document stays small and every field is reached across runs.
Strings mix plain words with hostile text (YAML, JSON and Jinja syntax, newlines, document
markers), since any of them may reach a manifest.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

HOSTILE = (
    "x\n  injected: true",
    "---\nkind: Secret",
    "{{ 7*7 }}",
    "{% if true %}x{% endif %}",
    "\"quoted\" 'single'",
    "key: value",
    "- item",
    "&a *a !!python/object",
    "# comment",
    "[flow] {map: 1}",
    "\t\u2028\U0001f600\x7f",
    "",
)
WORDS = ("nvidia", "gpu-operator", "true", "false", "1", "580.95.05", "a/b", "example.com/x")
Strategy = st.SearchStrategy[Any]


def strings(min_size: int = 0, max_size: int | None = None) -> Strategy:
    base = st.one_of(
        st.sampled_from(WORDS),
        st.sampled_from(HOSTILE),
        st.text(max_size=12),
    )
    if min_size or max_size is not None:
        base = base.filter(
            lambda s: len(s) >= min_size and (max_size is None or len(s) <= max_size)
        )
    return base


def _any_json(depth: int = 0) -> Strategy:
    leaf = st.one_of(st.booleans(), st.integers(-5, 1000), strings())
    if depth >= 2:
        return leaf
    return st.one_of(
        leaf,
        st.dictionaries(strings(min_size=1), st.deferred(lambda: _any_json(depth + 1)), max_size=2),
        st.lists(st.deferred(lambda: _any_json(depth + 1)), max_size=2),
    )


def from_schema(schema: dict[str, Any], *, fields: int = 4) -> Strategy:
    """Values ``schema`` accepts."""
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if schema.get("x-kubernetes-int-or-string"):
        return st.one_of(st.integers(0, 100), _string(schema))
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        return _object(schema, fields)
    if kind == "array":
        items = from_schema(schema.get("items") or {}, fields=fields)
        return st.lists(items, max_size=3)
    if kind == "string":
        return _string(schema)
    if kind == "integer":
        return st.integers(schema.get("minimum", -(2**31)), schema.get("maximum", 2**31 - 1))
    if kind == "number":
        return st.floats(schema.get("minimum"), schema.get("maximum"), allow_nan=False)
    if kind == "boolean":
        return st.booleans()
    return _any_json()


def _string(schema: dict[str, Any]) -> Strategy:
    if "pattern" in schema:
        return st.from_regex(schema["pattern"], fullmatch=True)
    return strings(schema.get("minLength", 0), schema.get("maxLength"))


def _object(schema: dict[str, Any], fields: int) -> Strategy:
    properties: dict[str, Any] = schema.get("properties") or {}
    required = list(schema.get("required") or ())
    if not properties:
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            return st.dictionaries(
                strings(min_size=1), from_schema(extra, fields=fields), max_size=3
            )
        if schema.get("x-kubernetes-preserve-unknown-fields"):
            return st.dictionaries(strings(min_size=1), _any_json(1), max_size=2)
        return st.just({})
    children = {
        name: st.deferred(lambda s=sub: from_schema(s, fields=fields))
        for name, sub in properties.items()
    }
    optional = sorted(set(properties) - set(required))

    def build(chosen: list[str]) -> Strategy:
        return st.fixed_dictionaries({name: children[name] for name in [*required, *chosen]})

    return (
        st.lists(st.sampled_from(optional), max_size=fields, unique=True).flatmap(build)
        if optional
        else build([])
    )
