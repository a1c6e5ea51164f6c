"""The jinja2 environment that turns the packaged templates into Kubernetes objects.

Security rule: every ``{{ expression }}`` is emitted as one JSON value (``finalize``). JSON is
YAML, so a user-controlled string (an env value, a ConfigMap name, an image tag) becomes exactly
one scalar whatever it contains: newlines, ``: ``, ``#``, quotes, ``&anchors``, ``{{ }}`` or
``---`` cannot add keys or documents. Templates therefore build strings inside one expression
(``{{ "nvidia-driver-daemonset-" ~ os.tag }}``) and dump lists and maps as flow JSON.

Shared YAML (``_shared/_daemonset.j2``) is written as macros and emitted with
``{% call macro(...) %}{% endcall %}``: a call block emits the macro's text as written, where
``{{ macro() }}`` would encode it as one string. A macro that needs the component's own YAML
takes it as the call body and reads it back with ``from_yaml``: that text was rendered under
the same rule, so parsing it cannot yield more than the template wrote.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from typing import Any

import jinja2
import yaml

from gpu_operator.render.wire import merge_env, merge_maps

TEMPLATE_SUFFIX = ".yaml.j2"
SHARED_FOLDER = "_shared"  # rendered with every enabled component, ordered among its own

# libyaml when available: same safe semantics, several times faster.
SAFE_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_NOT_PLAIN_ASCII = re.compile(r"[^\x00-\x7e]")
_encode_str = json.encoder.encode_basestring  # json.dumps(str, ensure_ascii=False)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def to_yaml_scalar(value: object) -> str:
    """One value as a single-line JSON document that YAML reads back unchanged.

    ``json.dumps(ensure_ascii=True)`` would write characters beyond U+FFFF as surrogate pairs,
    which YAML decodes as two lone surrogates; escaping them as ``\\UXXXXXXXX`` (and DEL, which
    YAML may not carry raw) keeps the round trip exact. Everything else is plain JSON.
    """
    if type(value) is str:  # most values: what json.dumps does for a str, without its setup
        text = _encode_str(value)
    else:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    return _NOT_PLAIN_ASCII.sub(_escape, text)


@functools.cache
def environment() -> jinja2.Environment:
    """The shared, cached environment over the package ``gpu_operator.templates``: the
    repository's ``templates/``, mapped into the package by setup.py."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("gpu_operator.templates", "."),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=to_yaml_scalar,
        auto_reload=False,  # package data: no need to stat each file on every use
    )
    env.globals["merge"] = merge_maps
    env.filters["from_yaml"] = from_yaml
    env.filters["merge_env"] = merge_env
    return env


@functools.cache
def templates(folder: str) -> tuple[str, ...]:
    """The manifests of one folder in file order: ``NNNN_<kind>.yaml.j2``.

    Other files in the folder (``_partial.yaml.j2``) are only reachable through ``include``.
    """
    pattern = re.compile(re.escape(folder) + r"/[0-9]{4}_[^/]+" + re.escape(TEMPLATE_SUFFIX))
    return tuple(sorted(n for n in environment().list_templates() if pattern.fullmatch(n)))


def from_yaml(text: str) -> Any:
    """A rendered YAML fragment (a macro's call body) as plain data; ``None`` when empty."""
    return json.loads(_parse_fragment(text))


@functools.lru_cache(maxsize=512)
def _parse_fragment(text: str) -> str:
    return json.dumps(yaml.load(text, Loader=SAFE_LOADER))


def clear_parse_caches() -> None:
    """Forget parsed texts, so a measurement sees what a changed policy costs."""
    _parse.cache_clear()
    _parse_fragment.cache_clear()


def render_template(name: str, context: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Render one template and parse it; empty documents (disabled parts) are dropped.

    Callers get fresh objects they may modify.
    """
    text = environment().get_template(name).render(context)
    return list(json.loads(_parse(name, text)))


@functools.lru_cache(maxsize=512)
def _parse(name: str, text: str) -> str:
    """YAML parsing dominates rendering and most texts repeat between reconciles: cache them,
    kept as JSON because ``json.loads`` is a fast deep copy of plain data."""
    docs = []
    for doc in yaml.load_all(text, Loader=SAFE_LOADER):
        if doc is None:
            continue
        if not isinstance(doc, dict):
            raise ValueError(f"{name}: a document is a {type(doc).__name__}, not an object")
        docs.append(doc)
    return json.dumps(docs)
