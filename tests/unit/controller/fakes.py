"""A small in-memory API server at the :class:`~gpu_operator.kube.Kube` wrapper's boundary.

It keeps objects as plain dicts, answers the wrapper's verbs the way the API server does
(404 for a missing object, 409 for a stale resourceVersion or an existing name, merge-patch
semantics, server-side apply replacing the object), records every write, and refuses chosen
requests with a chosen status so tests can exercise the failure paths.
"""

from __future__ import annotations

import copy
import functools
import json
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kubernetes.client.exceptions import ApiException

from gpu_operator.kinds import KINDS, kind_of

Key = tuple[str, str, str]
F = TypeVar("F", bound=Callable[..., Any])

# The executor calls the wrapper from worker threads: one request at a time, as a server would
# serialise writes to one object.
_LOCK = threading.RLock()


def _serialised(fn: F) -> F:
    @functools.wraps(fn)
    def locked(*args: Any, **kwargs: Any) -> Any:
        with _LOCK:
            return fn(*args, **kwargs)

    return locked  # type: ignore[return-value]


def api_error(status: int, message: str = "") -> ApiException:
    body = json.dumps({"kind": "Status", "message": message}) if message else None
    return ApiException(status=status, reason=f"status {status}", body=body)


def merge(target: dict[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """RFC 7386 JSON merge patch."""
    out = dict(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


@dataclass
class Refusal:
    status: int
    message: str
    times: int | None  # None: always


@dataclass
class FakeKube:
    objects: dict[Key, dict[str, Any]] = field(default_factory=dict)
    writes: list[tuple[str, str, str]] = field(default_factory=list)  # (verb, kind, name)
    refusals: dict[tuple[str, str, str], Refusal] = field(default_factory=dict)
    establish_crds: bool = True  # a CRD is Established as soon as it is applied
    # Set when the operator stops leading: the real wrapper then refuses every write.
    fence: threading.Event = field(default_factory=threading.Event)
    _version: int = 0
    _names: int = 0

    def with_retry(self, retry: object) -> FakeKube:
        """The same fake: it never fails on its own, so there is nothing to ask again."""
        return self

    # -- set-up ------------------------------------------------------------------------------

    def add(self, *objs: Mapping[str, Any]) -> FakeKube:
        for obj in objs:
            body = copy.deepcopy(dict(obj))
            body.setdefault("metadata", {})
            self._store(body)
        return self

    def refuse(
        self, verb: str, kind: str, name: str = "*", status: int = 409, *, times: int | None = None
    ) -> FakeKube:
        """Answer ``verb`` (get, list, apply, delete, patch, create, evict) on ``kind``/``name``
        with ``status``, ``times`` times (always when None)."""
        self.refusals[(verb, kind, name)] = Refusal(status, f"{verb} {kind}/{name} refused", times)
        return self

    def obj(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        return self.objects.get((kind, namespace or "", name))

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for (k, _, _), o in sorted(self.objects.items()) if k == kind]

    # -- the wrapper's verbs -----------------------------------------------------------------

    @_serialised
    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        self._check("get", kind, name)
        found = self.obj(kind, name, namespace)
        return copy.deepcopy(found) if found is not None else None

    @_serialised
    def list_objects(
        self,
        kind: str,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[dict[str, Any]]:
        self._check("list", kind, "*")
        items = [
            copy.deepcopy(o)
            for (k, ns, _), o in sorted(self.objects.items())
            if k == kind and (namespace is None or ns == namespace)
        ]
        for selector, read in ((label_selector, _label), (field_selector, _field)):
            for term in (selector or "").split(","):
                if term:
                    path, value = term.split("=", 1)
                    items = [o for o in items if read(o, path) == value]
        return items

    @_serialised
    def apply(self, obj: Mapping[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        kind = kind_of(obj).kind
        meta = obj["metadata"]
        self._check("apply", kind, meta["name"])
        key = (kind, meta.get("namespace") or "", meta["name"])
        body = copy.deepcopy(dict(obj))
        current = self.objects.get(key)
        generation = int((current or {}).get("metadata", {}).get("generation") or 0)
        if current is None or current.get("spec") != body.get("spec"):
            generation += 1
        body["metadata"]["generation"] = generation
        body["metadata"]["uid"] = (current or {}).get("metadata", {}).get("uid") or f"uid-{key}"
        if current is not None and "status" in current and "status" not in body:
            body["status"] = current["status"]
        if kind == "CustomResourceDefinition" and self.establish_crds:
            body["status"] = {"conditions": [{"type": "Established", "status": "True"}]}
        if dry_run:
            return body
        self.writes.append(("apply", kind, meta["name"]))
        return copy.deepcopy(self._store(body))

    @_serialised
    def delete(
        self,
        kind: str,
        name: str,
        namespace: str | None = None,
        *,
        grace_period_seconds: int | None = None,
    ) -> bool:
        self._check("delete", kind, name)
        self.writes.append(("delete", kind, name))
        return self.objects.pop((kind, namespace or "", name), None) is not None

    @_serialised
    def merge_patch(
        self,
        kind: str,
        name: str,
        patch: Mapping[str, Any],
        namespace: str | None = None,
        *,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        self._check("patch", kind, name)
        key = (kind, namespace or "", name)
        current = self.objects.get(key)
        if current is None:
            raise api_error(404, f'{kind} "{name}" not found')
        wanted = (patch.get("metadata") or {}).get("resourceVersion")
        if wanted is not None and wanted != current["metadata"].get("resourceVersion"):
            raise api_error(409, "the object has been modified; please apply your changes")
        if subresource == "status":
            patch = {"status": patch.get("status")}
        self.writes.append(("patch", kind if not subresource else f"{kind}/{subresource}", name))
        return copy.deepcopy(self._store(merge(current, patch)))

    @_serialised
    def json_patch(
        self, kind: str, name: str, operations: Any, namespace: str | None = None
    ) -> dict[str, Any]:
        """RFC 6902 add, remove and test on object members and list items (``-`` appends)."""
        self._check("patch", kind, name)
        key = (kind, namespace or "", name)
        current = self.objects.get(key)
        if current is None:
            raise api_error(404, f'{kind} "{name}" not found')
        body = copy.deepcopy(current)
        for op in operations:
            *parents, last = [
                p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]
            ]
            target: Any = body
            for part in parents:
                target = target[int(part)] if isinstance(target, list) else target.get(part)
                if target is None:
                    raise api_error(422, f"missing path: {op['path']}")
            at: Any = int(last) if isinstance(target, list) and last != "-" else last
            if op["op"] == "test":
                have = target[at] if isinstance(target, list) else target.get(at)
                if (have or None if have in ({}, []) else have) != op["value"]:  # omitempty
                    raise api_error(422, f"testing value {op['path']} failed")
            elif op["op"] == "remove":
                del target[at]
            elif isinstance(target, list):
                target.insert(len(target) if at == "-" else at, op["value"])
            else:
                target[at] = op["value"]
        self.writes.append(("patch", kind, name))
        return copy.deepcopy(self._store(body))

    @_serialised
    def create(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        kind = kind_of(obj).kind
        body = copy.deepcopy(dict(obj))
        meta = body["metadata"]
        if not meta.get("name"):
            self._names += 1
            meta["name"] = f"{meta.get('generateName', 'obj-')}{self._names}"
        self._check("create", kind, meta["name"])
        key = (kind, meta.get("namespace") or "", meta["name"])
        if kind_of(obj).namespaced and not meta.get("namespace"):
            raise api_error(400, "namespace required")
        if key in self.objects:
            raise api_error(409, f'{kind} "{meta["name"]}" already exists')
        self.writes.append(("create", kind, meta["name"]))
        return copy.deepcopy(self._store(body))

    @_serialised
    def evict(self, name: str, namespace: str) -> None:
        self._check("evict", "Pod", name)
        if (("Pod", namespace, name)) not in self.objects:
            raise api_error(404, f'pods "{name}" not found')
        self.writes.append(("evict", "Pod", name))
        del self.objects[("Pod", namespace, name)]

    # -- inside ------------------------------------------------------------------------------

    def _check(self, verb: str, kind: str, name: str) -> None:
        assert kind in KINDS, f"the real wrapper would fail: unknown kind {kind}"
        for key in ((verb, kind, name), (verb, kind, "*")):
            refusal = self.refusals.get(key)
            if refusal is None:
                continue
            if refusal.times is not None:
                refusal.times -= 1
                if refusal.times <= 0:
                    del self.refusals[key]
            raise api_error(refusal.status, refusal.message)

    def _store(self, body: dict[str, Any]) -> dict[str, Any]:
        self._version += 1
        body["metadata"]["resourceVersion"] = str(self._version)
        meta = body["metadata"]
        self.objects[(body["kind"], meta.get("namespace") or "", meta["name"])] = body
        return body


def _label(obj: Mapping[str, Any], key: str) -> str | None:
    labels: Mapping[str, str] = (obj.get("metadata") or {}).get("labels") or {}
    return labels.get(key)


def _field(obj: Mapping[str, Any], path: str) -> Any:
    value: Any = obj
    for part in path.split("."):
        value = (value or {}).get(part)
    return value


def writes_of(fake: FakeKube, verbs: Iterable[str]) -> list[tuple[str, str, str]]:
    wanted = set(verbs)
    return [w for w in fake.writes if w[0] in wanted]
