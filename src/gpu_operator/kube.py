"""The only door to the API server, for the operator and the node agents alike: a few REST
verbs over the official client.

Objects travel as plain dicts. Writes use one field manager. Nothing here decides anything.
Answers that mean "not now" (429 with its Retry-After, 5xx, a dropped connection; 409 for a
server-side apply, which cannot conflict otherwise with ``force``) are asked again a few times
with backoff, within a deadline, so an API server restart or overload costs a delay rather than
a failed pass. A POST is asked again only when it cannot have arrived (connection refused).
This is the only retry layer: urllib3's own retries are off, so a dead server costs the
attempts counted here and nothing more. A person at a terminal gets :data:`INTERACTIVE`, which
gives up within seconds.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import urllib3
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from gpu_operator.kinds import KINDS, kind_of
from gpu_operator.textfiles import decode_problem, yaml_problem
from gpu_operator.watchstream import Repeats, WatchStream

FIELD_MANAGER = "gpu-operator"
APPLY_PATCH = "application/apply-patch+yaml"
__all__ = [
    "FIELD_MANAGER",
    "INTERACTIVE",
    "NO_RETRY",
    "ClusterConfigError",
    "Fenced",
    "Kube",
    "Repeats",
    "Retry",
    "WatchStream",
    "api_configuration",
    "connect",
    "refreshing_at_most_every",
]
log = logging.getLogger(__name__)

# Statuses that say "not now": overloaded, restarting, or a proxy in between lost it.
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


@dataclass(frozen=True)
class Retry:
    """How often and how long to ask again; ``attempts`` counts the first one too."""

    attempts: int = 6
    first_delay_s: float = 0.25
    max_delay_s: float = 8.0
    deadline_s: float = 40.0

    def delay(self, attempt: int, retry_after: str | None = None) -> float:
        """Seconds before attempt ``attempt + 1``: the server's Retry-After when it sent one
        (capped), else exponential backoff with jitter."""
        if retry_after:
            try:
                return min(max(float(retry_after), 0.0), self.max_delay_s)
            except ValueError:
                pass  # an HTTP date: rare from an API server; back off as usual
        backoff: float = min(self.first_delay_s * 2.0 ** (attempt - 1), self.max_delay_s)
        return backoff * random.uniform(0.5, 1.0)


NO_RETRY = Retry(attempts=1)
# A command someone waits on (``upgrade status``): a blip is asked again once or twice, a server
# that does not answer is reported within seconds rather than after the operator's 40.
INTERACTIVE = Retry(attempts=3, first_delay_s=0.2, max_delay_s=1.0, deadline_s=5.0)


class ClusterConfigError(Exception):
    """No credentials for an API server: no kubeconfig where one was looked for (and not in a
    pod), or one the client cannot use. ``source`` says where they were looked for; ``missing``
    tells "none there" from "there but unusable"."""

    def __init__(self, source: str, problem: str, *, missing: bool = False) -> None:
        self.source, self.problem, self.missing = source, problem, missing
        super().__init__(f"{source}: {problem}")


class Fenced(RuntimeError):
    """A write after :attr:`Kube.fence` was set (e.g. leadership lost): not sent."""


def worth_retrying(method: str, content_type: str, error: Exception) -> bool:
    """Whether asking again may succeed and cannot do a write twice."""
    if isinstance(error, ApiException):
        if method == "POST":
            return (
                False  # evictions answer 429 for a PodDisruptionBudget; creates are not idempotent
            )
        if error.status == 409:
            return content_type == APPLY_PATCH
        return error.status in RETRY_STATUSES
    if isinstance(error, urllib3.exceptions.HTTPError):
        if method == "POST":
            return _never_sent(error)
        return True
    return False


def _never_sent(error: Exception) -> bool:
    reason = getattr(error, "reason", None)
    return isinstance(error, urllib3.exceptions.NewConnectionError) or isinstance(
        reason, urllib3.exceptions.NewConnectionError
    )


# How often a configuration's token refresh hook may run (see api_configuration).
TOKEN_REFRESH_S = 10.0


def api_configuration(
    kubeconfig: str | None = None, context: str | None = None
) -> k8s.Configuration:
    """In-cluster credentials in a pod, else the kubeconfig (``--kubeconfig``, else KUBECONFIG,
    else ~/.kube/config) at ``context`` (default: its current context). Raises
    :class:`ClusterConfigError` when there is none, or it cannot be used."""
    from kubernetes import config as kubeconfig_loader
    from kubernetes.config.config_exception import ConfigException

    configuration = k8s.Configuration()
    if kubeconfig is None and context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        try:
            kubeconfig_loader.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration
            )
        except ConfigException as exc:
            raise ClusterConfigError("this pod's service account", str(exc)) from None
    else:
        _load_kubeconfig(kubeconfig, context, configuration)
    # The client's annotations say the hook is always None; the loaders set one.
    hook: Callable[[k8s.Configuration], None] | None = configuration.refresh_api_key_hook
    if hook is not None:
        throttled = refreshing_at_most_every(hook, TOKEN_REFRESH_S)
        configuration.refresh_api_key_hook = throttled  # type: ignore[assignment]
    return configuration


def _load_kubeconfig(
    kubeconfig: str | None, context: str | None, configuration: k8s.Configuration
) -> None:
    """The kubeconfig's credentials into ``configuration``; what the loader says about a bad
    one (its own exception, or whatever reading garbage raised) as a ClusterConfigError."""
    from kubernetes import config as kubeconfig_loader
    from kubernetes.config.config_exception import ConfigException

    # Read here rather than by the loader, which took KUBECONFIG once, when it was imported.
    paths = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
    files = [os.path.expanduser(p) for p in paths.split(os.pathsep) if p]
    if not any(os.path.isfile(f) for f in files):
        where = ", ".join(files)
        raise ClusterConfigError(where, "no kubeconfig there, and not in a pod", missing=True)
    try:
        kubeconfig_loader.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=os.pathsep.join(files), context=context, client_configuration=configuration
        )
    except ConfigException as exc:
        problem = str(exc).removeprefix("Invalid kube-config file. ")
        raise ClusterConfigError(f"kubeconfig {paths}", problem) from None
    except yaml.YAMLError as exc:
        raise ClusterConfigError(f"kubeconfig {paths}", yaml_problem(exc)) from None
    except UnicodeDecodeError as exc:
        raise ClusterConfigError(f"kubeconfig {paths}", decode_problem(exc)) from None
    except (TypeError, AttributeError, KeyError):  # YAML, but not shaped like a kubeconfig
        problem = "not a kubeconfig (no clusters, users and contexts in it)"
        raise ClusterConfigError(f"kubeconfig {paths}", problem) from None


def refreshing_at_most_every(
    hook: Callable[[k8s.Configuration], None], every_s: float
) -> Callable[[k8s.Configuration], None]:
    """The loaders' token hook, run at most every ``every_s`` per configuration. The client
    runs it before every request, and the hook sets the host again, which re-reads the proxy
    environment: 0.1-0.3 ms a request, a tenth of an idle operator's Lease renewal. Tokens are
    read again a minute after the last read (in a pod) or 5 minutes before they expire
    (kubeconfig), so a few seconds' delay changes no token in time."""

    def refresh(configuration: k8s.Configuration) -> None:
        now = time.monotonic()
        if now < getattr(configuration, "token_refreshed_until", 0.0):
            return
        configuration.token_refreshed_until = now + every_s  # copies keep their own
        hook(configuration)
        # The loaders' hook puts itself back in; this one goes back over it.
        configuration.refresh_api_key_hook = refresh  # type: ignore[assignment]

    return refresh


# RFC 7234 warn-code, agent, "text": how the API server tells of a deprecated API or field.
_WARNING = re.compile(r'^\s*\d{3}\s+\S+\s+"(?P<text>(?:[^"\\]|\\.)*)"')
_warned: set[str] = set()
_warned_lock = threading.Lock()


def api_warnings(headers: Any) -> list[str]:
    """The texts of a response's ``Warning`` headers (none: an empty list)."""
    if headers is None:
        return []
    getlist = getattr(headers, "getlist", None)
    values = getlist("Warning") if getlist else [headers.get("Warning")]
    found = []
    for value in values:
        if value:
            match = _WARNING.match(value)
            found.append(match.group("text").replace('\\"', '"') if match else value.strip())
    return found


def _log_warnings(resp: Any, method: str, path: str) -> None:
    """Log each warning the API server gives (a deprecated API or field, a value it will
    refuse one day) once per process: what an operator must fix before the next upgrade of
    the cluster, said before that upgrade breaks it."""
    for text in api_warnings(getattr(resp, "headers", None)):
        with _warned_lock:
            if text in _warned:
                continue
            _warned.add(text)
        log.warning("the API server warns about %s %s: %s", method, path, text)


def _body(resp: Any, method: str, path: str) -> bytes:
    """The whole body of a response; an ApiException for an error status, with the headers
    (Retry-After) and ``request_line`` (``GET /api/v1/nodes``: what was refused, for people)."""
    _log_warnings(resp, method, path)
    data: bytes = resp.read()
    if resp.status >= 400:
        exc = ApiException(
            status=resp.status, reason=resp.reason, body=data.decode(errors="replace")
        )
        exc.headers = resp.headers
        exc.request_line = f"{method} {path}"  # type: ignore[attr-defined]
        raise exc
    return data


def connect(
    kubeconfig: str | None = None, context: str | None = None, *, retry: Retry | None = None
) -> Kube:
    """A client of the API server the credentials name (see :func:`api_configuration`)."""
    return Kube(k8s.ApiClient(api_configuration(kubeconfig, context)), retry or Retry())


class Kube:
    """Blocking REST calls; the async shell runs them in worker threads."""

    def __init__(self, api: k8s.ApiClient, retry: Retry = Retry()) -> None:
        self.api = api
        self.retry = retry
        # Set when this process must stop writing (its leadership is gone): every later
        # write, a retry included, raises Fenced instead of reaching the API server.
        self.fence = threading.Event()
        # This class is the one retry layer. urllib3's own asked again under it, at once and
        # unseen: up to 4 connections per attempt here, a warning logged for each, even for a
        # Lease renewal (asked once by design); and a GET would sleep whatever Retry-After
        # says, unbounded. Off, every failure comes here at once, as MaxRetryError naming the
        # server and the cause.
        pools = getattr(getattr(api, "rest_client", None), "pool_manager", None)
        if pools is not None:
            pools.connection_pool_kw["retries"] = urllib3.Retry(
                total=0, respect_retry_after_header=False, raise_on_status=False
            )

    def with_retry(self, retry: Retry) -> Kube:
        """The same connection, asking again as ``retry`` says (e.g. a Lease: never)."""
        return Kube(self.api, retry)

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
        policy = self.retry
        give_up = time.monotonic() + policy.deadline_s
        attempt = 1
        while True:
            if method != "GET" and self.fence.is_set():
                raise Fenced(f"{method} {path}: not sent, this process no longer leads")
            try:
                resp = self._send(method, path, query, body, content_type, timeout)
                data = _body(resp, method, path)
                return json.loads(data) if data else None
            except (ApiException, urllib3.exceptions.HTTPError) as exc:
                if attempt >= policy.attempts or not worth_retrying(method, content_type, exc):
                    raise
                headers = getattr(exc, "headers", None) or {}
                delay = policy.delay(attempt, headers.get("Retry-After"))
                if time.monotonic() + delay > give_up:
                    raise
                log.debug("%s %s: %s; asking again in %.2fs", method, path, _short(exc), delay)
                time.sleep(delay)
                attempt += 1

    def _send(
        self,
        method: str,
        path: str,
        query: Mapping[str, str] | None,
        body: Any,
        content_type: str,
        timeout: float | None,
    ) -> Any:
        """The response, its body not yet read."""
        headers = {"Accept": "application/json", "Content-Type": content_type}
        method, url, headers, body, _ = self.api.param_serialize(
            method,
            path,
            query_params=list((query or {}).items()),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        return self.api.call_api(
            method, url, header_params=headers, body=body, _request_timeout=timeout
        )

    def wait_for_change(
        self,
        kind: str,
        name: str,
        resource_version: str,
        timeout_s: int,
        namespace: str | None = None,
    ) -> bool:
        """Block until the object changes after ``resource_version`` (True) or ``timeout_s``
        passes (False): one watch, ended by its first event."""
        query = {
            "watch": "true",
            "fieldSelector": f"metadata.name={name}",
            "timeoutSeconds": str(timeout_s),
        }
        if resource_version:
            query["resourceVersion"] = resource_version
        resp = self._send(
            "GET",
            KINDS[kind].collection(namespace),
            query,
            None,
            "application/json",
            timeout_s + 30,
        )
        try:
            if resp.status >= 400:
                _body(resp, "GET", KINDS[kind].collection(namespace))  # raises
            return any(chunk for chunk in resp.response.stream(4096))
        finally:
            # Close before returning the connection: the rest of the stream must not be read
            # as the answer to the next request.
            resp.response.close()
            resp.response.release_conn()

    # -- reads ---------------------------------------------------------------------------------

    def server_version(self) -> tuple[int, int]:
        """The API server's Kubernetes version, ``(1, 34)`` (a ``34+`` minor read as 34)."""
        info = self._version()
        major, minor = (re.match(r"\d+", str(info.get(k, ""))) for k in ("major", "minor"))
        if major is None or minor is None:
            raise ValueError(f"the API server's /version says {info}: no major and minor")
        return int(major.group()), int(minor.group())

    def release(self) -> str:
        """The API server's release as it names it (``v1.33.13``); "" when it says none."""
        return str(self._version().get("gitVersion") or "")

    def _version(self) -> dict[str, Any]:
        info: dict[str, Any] = self.request("GET", "/version") or {}
        return info

    def serves(self, api_version: str) -> bool:
        """Whether the API server serves ``api_version`` (``resource.k8s.io/v1``): one
        discovery read."""
        try:
            self.request("GET", f"/apis/{api_version}")
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = self.request("GET", KINDS[kind].item(name, namespace))
            return obj
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def list_objects(
        self,
        kind: str,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[dict[str, Any]]:
        query = {}
        if label_selector:
            query["labelSelector"] = label_selector
        if field_selector:
            query["fieldSelector"] = field_selector
        return self.list_with_version(kind, namespace, query)[0]

    def list_with_version(
        self,
        kind: str,
        namespace: str | None = None,
        query: Mapping[str, str] | None = None,
        keep: Callable[[dict[str, Any]], Any] | None = None,
    ) -> tuple[list[Any], str]:
        """Every object (in pages of 500), or what ``keep`` makes of each, page by page (so a
        fleet's whole objects are never all in memory at once), and the list's
        resourceVersion, to watch from."""
        items: list[Any] = []
        path = KINDS[kind].collection(namespace)
        paged = {**(query or {}), "limit": "500"}
        while True:
            data = self.request("GET", path, query=paged)
            page = data.pop("items", None) or []
            items.extend(map(keep, page) if keep else page)
            del page  # freed before the next page is read
            meta = data.get("metadata") or {}
            if not meta.get("continue"):
                return items, str(meta.get("resourceVersion") or "")
            paged["continue"] = meta["continue"]

    def watch(
        self,
        kind: str,
        namespace: str | None,
        resource_version: str,
        timeout_s: int,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        compact: bool = False,
        repeats: Repeats | None = None,
        pace_s: float = 0.0,
    ) -> WatchStream:
        """One watch request from ``resource_version`` (with bookmarks), ended by the server
        after ``timeout_s``; iterate it for the events (``compact``, ``repeats``, ``pace_s``:
        see :class:`WatchStream`).
        Not asked again here: the informer backs off and resumes (an ApiException carries the
        headers, Retry-After included)."""
        query = {
            "watch": "true",
            "allowWatchBookmarks": "true",
            "resourceVersion": resource_version,
            "timeoutSeconds": str(timeout_s),
        }
        if label_selector:
            query["labelSelector"] = label_selector
        if field_selector:
            query["fieldSelector"] = field_selector
        path = KINDS[kind].collection(namespace)
        resp = self._send("GET", path, query, None, "application/json", timeout_s + 30)
        if resp.status >= 400:
            try:
                _body(resp, "GET", path)  # raises
            finally:
                resp.response.release_conn()
        return WatchStream(resp.response, compact=compact, repeats=repeats, pace_s=pace_s)

    # -- writes --------------------------------------------------------------------------------

    def apply(self, obj: Mapping[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        """Server-side apply with the operator's field manager, taking over conflicting fields."""
        kind = kind_of(obj)
        meta = obj["metadata"]
        query = {"fieldManager": FIELD_MANAGER, "force": "true"}
        if dry_run:
            query["dryRun"] = "All"
        result: dict[str, Any] = self.request(
            "PATCH",
            kind.item(meta["name"], meta.get("namespace")),
            query=query,
            body=dict(obj),
            content_type=APPLY_PATCH,
        )
        return result

    def delete(
        self,
        kind: str,
        name: str,
        namespace: str | None = None,
        *,
        grace_period_seconds: int | None = None,
        propagation: str = "Background",
    ) -> bool:
        """Delete; dependents go by GC, after the object (``Background``) or before it
        (``Foreground``: the object stays, deleting, until they are gone). False when it was
        already gone."""
        body: dict[str, Any] = {"propagationPolicy": propagation}
        if grace_period_seconds is not None:
            body["gracePeriodSeconds"] = grace_period_seconds
        try:
            self.request("DELETE", KINDS[kind].item(name, namespace), body=body)
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise

    def merge_patch(
        self,
        kind: str,
        name: str,
        patch: Mapping[str, Any],
        namespace: str | None = None,
        *,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        return self._patch(kind, name, patch, namespace, subresource, "merge-patch")

    def strategic_patch(
        self,
        kind: str,
        name: str,
        patch: Mapping[str, Any],
        namespace: str | None = None,
        *,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        """A strategic merge patch (built-in kinds only): lists such as a Node's
        ``status.conditions`` merge by their key (``type``) instead of being replaced, so one
        writer's entry leaves the others' alone."""
        return self._patch(kind, name, patch, namespace, subresource, "strategic-merge-patch")

    def _patch(
        self,
        kind: str,
        name: str,
        patch: Mapping[str, Any],
        namespace: str | None,
        subresource: str | None,
        flavour: str,
    ) -> dict[str, Any]:
        path = KINDS[kind].item(name, namespace)
        if subresource:
            path += f"/{subresource}"
        result: dict[str, Any] = self.request(
            "PATCH",
            path,
            query={"fieldManager": FIELD_MANAGER},
            body=dict(patch),
            content_type=f"application/{flavour}+json",
        )
        return result

    def json_patch(
        self, kind: str, name: str, operations: Any, namespace: str | None = None
    ) -> dict[str, Any]:
        """An RFC 6902 JSON patch: its ``test`` operations make it all-or-nothing (422)."""
        result: dict[str, Any] = self.request(
            "PATCH",
            KINDS[kind].item(name, namespace),
            query={"fieldManager": FIELD_MANAGER},
            body=list(operations),
            content_type="application/json-patch+json",
        )
        return result

    def create(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        kind = kind_of(obj)
        result: dict[str, Any] = self.request(
            "POST", kind.collection(obj["metadata"].get("namespace")), body=dict(obj)
        )
        return result

    def evict(self, name: str, namespace: str) -> None:
        """Eviction API: honours PodDisruptionBudgets (429 when one forbids it)."""
        self.request(
            "POST",
            KINDS["Pod"].item(name, namespace) + "/eviction",
            body={
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": name, "namespace": namespace},
            },
        )


def _short(exc: Exception) -> str:
    if isinstance(exc, ApiException):
        return f"{exc.status} {exc.reason}"
    return type(exc).__name__
