"""The unit tests' one fake Kube client: an in-memory API server at the
:class:`~gpu_operator.kube.Kube` wrapper's boundary.

It keeps objects as plain dicts keyed by (kind, namespace, name) and answers the wrapper's verbs,
under the wrapper's names and signatures, the way the API server does: None for a missing object
on a read, 404 for a patch of one, 409 for a stale resourceVersion or an existing name,
merge-patch semantics, server-side apply replacing the object, a new resourceVersion on every
change. It records every request (:attr:`FakeKube.calls`) and every write answered
(:attr:`FakeKube.writes`), refuses chosen requests with a chosen status (:meth:`FakeKube.refuse`)
so tests can exercise the failure paths, and runs a test's hooks around requests: before one is
answered (:attr:`FakeKube.on_request`: a slow or hung link, a fault, an assertion on what was
asked) and after a write (:attr:`FakeKube.on_write`: a controller of the cluster reacting).

Below the wrapper, :class:`ScriptedRequests` is the wrapper itself over a test's answers, for
tests of the HTTP requests its verbs make.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from kubernetes.client.exceptions import ApiException

from gpu_operator.kinds import KINDS, kind_of
from gpu_operator.kube import Kube, Retry

Key = tuple[str, str, str]  # (kind, namespace or "", name)


class Call(NamedTuple):
    """One request as the fake received it, before it was answered (refused ones too)."""

    verb: str  # get, list, watch, apply, create, patch, delete, evict
    kind: str  # "Node/status" for a subresource
    name: str  # "*" for a list
    namespace: str  # "" for a cluster-scoped object, or a list across namespaces
    body: Any = None  # a copy of what was sent: object, patch, operations; a list's selectors


Hook = Callable[[Call], None]


def api_error(status: int, message: str = "") -> ApiException:
    """An ApiException as the wrapper raises it for a refused request, with a Status body."""
    body = json.dumps({"kind": "Status", "message": message}) if message else None
    return ApiException(status=status, reason=f"status {status}", body=body)


def merge(target: dict[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """RFC 7386 JSON merge patch: ``target`` with ``patch`` merged in (None removes a key)."""
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
    """How a refused request is answered: ``status``, ``times`` more times (None: always)."""

    status: int
    message: str
    times: int | None


@dataclass
class FakeKube:
    """An in-memory API server answering the wrapper's verbs; see the module's docstring."""

    objects: dict[Key, dict[str, Any]] = field(default_factory=dict)
    writes: list[tuple[str, str, str]] = field(default_factory=list)  # (verb, kind, name)
    calls: list[Call] = field(default_factory=list)  # every request, reads included
    refusals: dict[tuple[str, str, str], Refusal] = field(default_factory=dict)
    establish_crds: bool = True  # a CRD is Established as soon as it is applied
    # Before a request is answered, outside the fake's lock: it may sleep (a slow link), block
    # (a hung server), raise (a fault), assert on what was asked, or change the store.
    on_request: Hook | None = None
    # After a write is stored: stands in for the cluster's controllers (a DaemonSet's pods
    # going when their node's label is paused). It changes the store with ``add`` and
    # ``remove``, as another client would, so its changes are not requests or writes.
    on_write: Hook | None = None
    # Set when the operator stops leading: the real wrapper then refuses every write.
    fence: threading.Event = field(default_factory=threading.Event)
    # What discovery says: the release, and the API versions it does not serve.
    server_release: str = "v1.37.2"
    unserved: frozenset[str] = frozenset()
    _version: int = 0
    _names: int = 0
    # The executor calls the wrapper from worker threads: one request at a time, as a server
    # would serialise writes to one object.
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False)
    _changed: threading.Condition = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._changed = threading.Condition(self._lock)

    def with_retry(self, retry: Retry) -> FakeKube:
        """The same fake: it never fails on its own, so there is nothing to ask again."""
        return self

    # -- set-up and inspection (not requests: nothing is recorded) ---------------------------

    def add(self, *objs: Mapping[str, Any]) -> FakeKube:
        """Store copies of ``objs`` as they are, each with a new resourceVersion, as another
        client's writes would: a later ``add`` of a changed copy is someone else's change."""
        with self._lock:
            for obj in objs:
                body = copy.deepcopy(dict(obj))
                body.setdefault("metadata", {})
                self._store(body)
        return self

    def remove(self, kind: str, name: str, namespace: str | None = None) -> bool:
        """Drop an object as another client's delete would (no request, no write); False
        when there was none."""
        with self._lock:
            gone = self.objects.pop((kind, namespace or "", name), None) is not None
            self._changed.notify_all()
        return gone

    def refuse(
        self, verb: str, kind: str, name: str = "*", status: int = 409, *, times: int | None = None
    ) -> FakeKube:
        """Answer ``verb`` (get, list, watch, apply, delete, patch, create, evict) on
        ``kind``/``name`` with ``status``, ``times`` times (always when None)."""
        self.refusals[(verb, kind, name)] = Refusal(status, f"{verb} {kind}/{name} refused", times)
        return self

    def obj(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """The stored object itself (not a copy: a test may change it in place), or None."""
        return self.objects.get((kind, namespace or "", name))

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        """The stored objects of ``kind``, in key order."""
        return [o for (k, _, _), o in sorted(self.objects.items()) if k == kind]

    # -- the wrapper's verbs -----------------------------------------------------------------

    def release(self) -> str:
        with self._lock:  # a read of /version, not of a kind: recorded, never refused
            self.calls.append(Call("get", "version", "", ""))
        return self.server_release

    def serves(self, api_version: str) -> bool:
        with self._lock:  # a discovery read, as release()
            self.calls.append(Call("get", "discovery", api_version, ""))
        return api_version not in self.unserved

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        self._ask("get", kind, name, namespace)
        with self._lock:
            found = self.obj(kind, name, namespace)
            return copy.deepcopy(found) if found is not None else None

    def list_objects(
        self,
        kind: str,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[dict[str, Any]]:
        """Equality selectors only (``key=value``, comma-separated), as the project sends."""
        selectors = {"labelSelector": label_selector, "fieldSelector": field_selector}
        query = {k: v for k, v in selectors.items() if v}
        self._ask("list", kind, "*", namespace, query or None)
        with self._lock:
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

    def wait_for_change(
        self,
        kind: str,
        name: str,
        resource_version: str,
        timeout_s: int,
        namespace: str | None = None,
    ) -> bool:
        """True once the object's resourceVersion is not ``resource_version`` (it changed or
        went), at once if it already is; False after ``timeout_s`` without a change."""
        self._ask("watch", kind, name, namespace)

        def changed() -> bool:
            found = self.obj(kind, name, namespace) or {}
            version: str | None = found.get("metadata", {}).get("resourceVersion")
            return version != resource_version

        with self._changed:
            return self._changed.wait_for(changed, timeout=timeout_s)

    def apply(self, obj: Mapping[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        kind = kind_of(obj).kind
        meta = obj["metadata"]
        call = self._ask("apply", kind, meta["name"], meta.get("namespace"), obj)
        with self._lock:
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
            stored = copy.deepcopy(self._store(body))
        self._reacted(call)
        return stored

    def delete(
        self,
        kind: str,
        name: str,
        namespace: str | None = None,
        *,
        grace_period_seconds: int | None = None,
        propagation: str = "Background",
    ) -> bool:
        """False when it was already gone. Dependents stay: the fake runs no garbage
        collector (``propagation`` is accepted for the wrapper's signature)."""
        call = self._ask("delete", kind, name, namespace)
        with self._lock:
            self.writes.append(("delete", kind, name))
            gone = self.objects.pop((kind, namespace or "", name), None) is not None
            self._changed.notify_all()
        self._reacted(call)
        return gone

    def merge_patch(
        self,
        kind: str,
        name: str,
        patch: Mapping[str, Any],
        namespace: str | None = None,
        *,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        """A resourceVersion in the patch's metadata must be the stored one (else 409); a
        ``status`` subresource patch changes only ``status``."""
        written = kind if not subresource else f"{kind}/{subresource}"
        call = self._ask("patch", written, name, namespace, patch, check_kind=kind)
        with self._lock:
            key = (kind, namespace or "", name)
            current = self.objects.get(key)
            if current is None:
                raise api_error(404, f'{kind} "{name}" not found')
            wanted = (patch.get("metadata") or {}).get("resourceVersion")
            if wanted is not None and wanted != current["metadata"].get("resourceVersion"):
                raise api_error(409, "the object has been modified; please apply your changes")
            if subresource == "status":
                patch = {"status": patch.get("status")}
            self.writes.append(("patch", written, name))
            stored = copy.deepcopy(self._store(merge(current, patch)))
        self._reacted(call)
        return stored

    def json_patch(
        self, kind: str, name: str, operations: Any, namespace: str | None = None
    ) -> dict[str, Any]:
        """RFC 6902 add, remove and test on object members and list items (``-`` appends)."""
        operations = list(operations)
        call = self._ask("patch", kind, name, namespace, operations)
        with self._lock:
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
            stored = copy.deepcopy(self._store(body))
        self._reacted(call)
        return stored

    def create(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """A ``generateName`` gets a numbered name; an existing name is a 409."""
        kind = kind_of(obj).kind
        body = copy.deepcopy(dict(obj))
        meta = body["metadata"]
        with self._lock:
            if not meta.get("name"):
                self._names += 1
                meta["name"] = f"{meta.get('generateName', 'obj-')}{self._names}"
        call = self._ask("create", kind, meta["name"], meta.get("namespace"), obj)
        with self._lock:
            key = (kind, meta.get("namespace") or "", meta["name"])
            if kind_of(obj).namespaced and not meta.get("namespace"):
                raise api_error(400, "namespace required")
            if key in self.objects:
                raise api_error(409, f'{kind} "{meta["name"]}" already exists')
            self.writes.append(("create", kind, meta["name"]))
            stored = copy.deepcopy(self._store(body))
        self._reacted(call)
        return stored

    def evict(self, name: str, namespace: str) -> None:
        call = self._ask("evict", "Pod", name, namespace)
        with self._lock:
            if ("Pod", namespace, name) not in self.objects:
                raise api_error(404, f'pods "{name}" not found')
            self.writes.append(("evict", "Pod", name))
            del self.objects[("Pod", namespace, name)]
            self._changed.notify_all()
        self._reacted(call)

    # -- inside ------------------------------------------------------------------------------

    def _ask(
        self,
        verb: str,
        kind: str,
        name: str,
        namespace: str | None,
        body: Any = None,
        *,
        check_kind: str | None = None,
    ) -> Call:
        """Record the request, run ``on_request``, then raise a refusal set for it, if any
        (``check_kind``: the kind refusals name, for a subresource's request)."""
        call = Call(verb, kind, name, namespace or "", copy.deepcopy(body))
        with self._lock:
            self.calls.append(call)
        if self.on_request is not None:
            self.on_request(call)
        with self._lock:
            self._check(verb, check_kind or kind, name)
        return call

    def _reacted(self, call: Call) -> None:
        if self.on_write is not None:
            self.on_write(call)

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
        self._changed.notify_all()
        return body


def _label(obj: Mapping[str, Any], key: str) -> str | None:
    labels: Mapping[str, str] = (obj.get("metadata") or {}).get("labels") or {}
    return labels.get(key)


def _field(obj: Mapping[str, Any], path: str) -> Any:
    value: Any = obj
    for part in path.split("."):
        value = (value or {}).get(part)
    return value


class Request(NamedTuple):
    """One request the wrapper sent to :class:`ScriptedRequests`."""

    method: str
    path: str
    query: dict[str, str] | None
    body: Any
    content_type: str


class ScriptedRequests(Kube):
    """The real wrapper with no connection under it, for tests of the requests themselves (the
    path, body and content type a verb sends, the pages of a list) where :class:`FakeKube`
    stands in above them: every request is recorded (:attr:`sent`) and answered by the test's
    ``answer``."""

    def __init__(self, answer: Callable[[Request], Any]) -> None:  # no client: nothing is sent
        self.sent: list[Request] = []
        self.answer = answer

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | None = 30.0,
    ) -> Any:
        sent = Request(method, path, None if query is None else dict(query), body, content_type)
        self.sent.append(sent)
        return self.answer(sent)
