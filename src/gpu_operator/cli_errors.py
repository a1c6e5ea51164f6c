"""What a failed command says: one line on stderr, ``error: <what>: <what to do>``, and an exit
code a script can act on. :func:`explain` is pure (an exception in, the code and the line out),
so every case is a table row in a unit test; :func:`gpu_operator.cli.main` prints its answer.

Exit codes (also at the end of ``gpu-operator --help``):

  0    done
  1    bad input: a policy, a file or a value the command cannot use
  2    usage: an unknown or missing option, a bad option value
  3    the cluster: no kubeconfig and not in a pod, the API server unreachable, credentials
       refused (401) or not allowed (403), the CRDs not installed
  4    no usable GPU driver: NVML missing or failing
  130  interrupted (^C)
"""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Callable
from typing import Any

import urllib3
import yaml
from kubernetes.client.exceptions import ApiException

from gpu_operator.agent.driverroot import DriverNotFound
from gpu_operator.agent.nvml import NvmlError, NvmlUnavailable
from gpu_operator.api import PolicyError
from gpu_operator.kube import RETRY_STATUSES, ClusterConfigError
from gpu_operator.textfiles import SAVE_AS_UTF8, FileProblem, decode_problem, yaml_problem
from gpu_operator.usage import UsageProblem

OK, BAD_INPUT, USAGE, CLUSTER, NO_DRIVER, INTERRUPTED = 0, 1, 2, 3, 4, 130
EXIT_CODES = (
    (OK, "done"),
    (BAD_INPUT, "bad input: a policy, a file or a value the command cannot use"),
    (USAGE, "usage: an unknown or missing option, a bad option value"),
    (
        CLUSTER,
        "the cluster: no kubeconfig and not in a pod, the API server unreachable, credentials "
        "refused (401) or not allowed (403), the CRDs not installed",
    ),
    (NO_DRIVER, "no usable GPU driver: NVML missing or failing"),
    (INTERRUPTED, "interrupted (^C)"),
)

KUBECONFIG_HINT = "set KUBECONFIG or pass --kubeconfig FILE (and --context NAME)"
SERVER_HINT = (
    "check that the cluster is up and that the kubeconfig (--kubeconfig, --context) names its "
    "server"
)
DRIVER_ROOT_HINT = (
    "install the NVIDIA driver, or point --driver-root (env CONTAINER_DRIVER_ROOT or "
    "NVIDIA_DRIVER_ROOT) at where this container has it: /run/nvidia/driver under a driver "
    "container, once that container is ready"
)
NVML_HINT = DRIVER_ROOT_HINT + "; or run on simulated GPUs with --simulate PROFILE:COUNT"
CRD_HINT = "the CRDs are not installed: run `gpu-operator crd --apply`"
DEBUG_HINT = "an unexpected failure: run with --debug to see where"

Explained = tuple[int, str, str]  # exit code, what went wrong, what to do ("" for nothing)
Rule = tuple[type[BaseException] | tuple[type[BaseException], ...], Callable[..., Explained]]


def exit_codes_text(width: int = 79) -> str:
    """The exit codes as ``--help`` ends with them, wrapped to ``width``."""
    rows = (
        textwrap.fill(meaning, width, initial_indent=f"  {code:<5}", subsequent_indent=" " * 7)
        for code, meaning in EXIT_CODES
    )
    return "exit codes:\n" + "\n".join(rows) + "\n"


def one_line(what: str, todo: str = "") -> str:
    """``error: <what>: <what to do>``, newlines and runs of blanks made single spaces."""
    text = f"{what}: {todo}" if todo else what
    return "error: " + " ".join(text.split())


def explain(exc: BaseException) -> tuple[int, str]:
    """The exit code for ``exc`` and the one line that tells a person what happened and what
    to do about it; an exception no rule knows is reported as unexpected (exit 1)."""
    for kind, rule in RULES:
        if isinstance(exc, kind):
            code, what, todo = rule(exc)
            return code, one_line(what, todo)
    return BAD_INPUT, one_line(f"{type(exc).__name__}: {exc}", DEBUG_HINT)


# -- the cluster ----------------------------------------------------------------------------------
def _no_cluster(exc: ClusterConfigError) -> Explained:
    if exc.missing:
        where = f"no kubeconfig at {exc.source}, and not running in a pod"
        return CLUSTER, f"no cluster to talk to: {where}", KUBECONFIG_HINT
    return (
        CLUSTER,
        f"{exc.source}: {exc.problem}",
        "fix it, or pick another --kubeconfig or --context",
    )


def _unreachable(exc: urllib3.exceptions.HTTPError) -> Explained:
    reason: BaseException = getattr(exc, "reason", None) or exc
    return CLUSTER, f"cannot reach the API server at {_server(exc)}: {_cause(reason)}", SERVER_HINT


def _server(exc: BaseException) -> str:
    """The URL of the server the connection was for, as far as the exception tells."""
    for holder in (getattr(exc, "pool", None), getattr(getattr(exc, "reason", None), "conn", None)):
        host = getattr(holder, "host", None)
        if host:
            scheme = getattr(holder, "scheme", None) or "https"
            return f"{scheme}://{host}:{getattr(holder, 'port', None) or 443}"
    return "its address"


def _cause(reason: BaseException) -> str:
    errors = urllib3.exceptions
    if isinstance(reason, errors.NameResolutionError):
        return "its host name does not resolve"
    if isinstance(reason, errors.NewConnectionError):
        text = str(reason).split("Failed to establish a new connection: ", 1)[-1]
        return re.sub(r"^\[Errno -?\d+\] ", "", text).lower()
    if isinstance(reason, errors.ConnectTimeoutError):
        return "connecting timed out"
    if isinstance(reason, errors.ReadTimeoutError):
        return "it took the connection but did not answer in time"
    if isinstance(reason, errors.SSLError):
        return f"TLS failed ({reason}): check the kubeconfig's certificate-authority"
    if isinstance(reason, errors.ProtocolError):
        return "the connection was dropped"
    return str(reason)


def _refused(exc: ApiException) -> Explained:
    status = int(exc.status or 0)
    body = _status_body(exc.body)
    message = str(body.get("message") or exc.reason or "")
    request = str(getattr(exc, "request_line", "") or "")
    of = f" for {request}" if request else ""
    if status == 0:  # the client's own: TLS failed before any answer
        first = str(exc.reason or "").splitlines()[-1:] or ["?"]
        return CLUSTER, f"TLS to the API server failed: {first[0]}", SERVER_HINT
    if status == 401:
        return (
            CLUSTER,
            f"the API server refused the credentials (401 Unauthorized{of})",
            "the kubeconfig's token or certificate is wrong or expired: log in again, or pick "
            "another --kubeconfig or --context",
        )
    if status == 403:
        return CLUSTER, f"not allowed: {message or request}", _rbac_hint(message, request)
    if status == 404 and "/apis/nvidia.com/" in request:
        details = body.get("details") or {}
        if not details.get("name"):
            resource = _target(request)[1]
            return CLUSTER, f"the API server has no {resource} (404{of})", CRD_HINT
    if status in RETRY_STATUSES:
        return (
            CLUSTER,
            f"the API server answered {status} {exc.reason}{of}: {message}",
            "it is overloaded or restarting: try again shortly",
        )
    return BAD_INPUT, f"the API server refused {request or 'the request'}: {status} {message}", ""


def _status_body(body: Any) -> dict[str, Any]:
    """A Kubernetes Status from an error body; empty when it is something else."""
    try:
        doc = json.loads(body or "")
    except (TypeError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


_FORBIDDEN = re.compile(
    r'cannot (?P<verb>[\w-]+) resource "(?P<resource>[^"]+)" in API group "(?P<group>[^"]*)"'
    r'(?: in the namespace "(?P<namespace>[^"]+)")?'
)
_VERBS = {"GET": "get", "PATCH": "patch", "PUT": "update", "POST": "create", "DELETE": "delete"}


def _rbac_hint(message: str, request: str) -> str:
    """Which RBAC rule is missing: from the API server's own words, else from the request."""
    found = _FORBIDDEN.search(message)
    if found:
        verb, group, namespace = found["verb"], found["group"], found["namespace"]
        resource = f"{found['resource']}.{group}" if group else found["resource"]
    else:
        verb, resource, namespace = _target(request)
    where = (
        f"a Role and RoleBinding in namespace {namespace}"
        if namespace
        else "a ClusterRole and ClusterRoleBinding"
    )
    return (
        f"the kubeconfig's user needs RBAC to {verb} {resource} ({where} granting it), or pick "
        "a --kubeconfig or --context that has it"
    )


def _target(request: str) -> tuple[str, str, str | None]:
    """The verb, resource (``plural.group``) and namespace of ``GET /apis/g/v/...``."""
    method, _, path = request.partition(" ")
    parts = path.split("?", 1)[0].strip("/").split("/")
    group = ""
    if parts[:1] == ["apis"] and len(parts) > 2:
        group, parts = parts[1], parts[3:]
    else:
        parts = parts[2:]  # api/v1/...
    namespace = None
    if len(parts) > 2 and parts[0] == "namespaces":
        namespace, parts = parts[1], parts[2:]
    plural = parts[0] if parts else "resources"
    resource = f"{plural}.{group}" if group else plural
    verb = _VERBS.get(method, method.lower() or "use")
    if method == "GET" and len(parts) < 2:
        verb = "list"
    return verb, resource, namespace


# -- the GPU driver -------------------------------------------------------------------------------
def _no_nvml(exc: NvmlError) -> Explained:
    if isinstance(exc, NvmlUnavailable):
        return NO_DRIVER, f"no usable NVIDIA driver: {exc}", NVML_HINT
    return (
        NO_DRIVER,
        f"NVML failed: {exc}",
        "the GPU or its driver is in trouble: see nvidia-smi and the node's kernel log",
    )


def _no_driver(exc: DriverNotFound) -> Explained:
    return NO_DRIVER, f"no NVIDIA driver: {exc}", DRIVER_ROOT_HINT


# -- input ----------------------------------------------------------------------------------------
def _bad_file(exc: FileProblem) -> Explained:
    return BAD_INPUT, f"{exc.path}: {exc.problem}", exc.hint


def _not_utf8(exc: UnicodeDecodeError) -> Explained:
    return BAD_INPUT, f"a file given is {decode_problem(exc)}", SAVE_AS_UTF8


def _bad_yaml(exc: yaml.YAMLError) -> Explained:
    mark = getattr(exc, "problem_mark", None)
    name = str(getattr(mark, "name", "") or "")
    where = f"{name}: " if name and not name.startswith("<") else ""
    return BAD_INPUT, where + yaml_problem(exc), "fix the YAML there"


def _os_error(exc: OSError) -> Explained:
    what = exc.strerror or str(exc)
    if exc.filename is not None:
        what = f"{exc.filename}: {what}"
    todo = ""
    if isinstance(exc, FileNotFoundError):
        todo = "check the path"
    elif isinstance(exc, PermissionError):
        todo = "check its permissions, or run as a user who may use it"
    return BAD_INPUT, what, todo


def _invalid_policy(exc: PolicyError) -> Explained:
    return BAD_INPUT, "; ".join(exc.problems), ""


def _misused(exc: UsageProblem) -> Explained:
    return USAGE, exc.what, exc.todo


def _bad_value(exc: BaseException) -> Explained:
    return BAD_INPUT, str(exc), ""


def _interrupted(_: BaseException) -> Explained:
    return INTERRUPTED, "interrupted", ""


# First match wins: the narrower kinds (most are ValueErrors) before the broad ones.
RULES: tuple[Rule, ...] = (
    (KeyboardInterrupt, _interrupted),
    (ClusterConfigError, _no_cluster),
    (ApiException, _refused),
    (urllib3.exceptions.HTTPError, _unreachable),
    (NvmlError, _no_nvml),
    (DriverNotFound, _no_driver),
    (FileProblem, _bad_file),
    (UnicodeDecodeError, _not_utf8),
    (yaml.YAMLError, _bad_yaml),
    (PolicyError, _invalid_policy),
    (UsageProblem, _misused),
    (ValueError, _bad_value),  # SimulationError, LogSettingError, a config's validation
    (OSError, _os_error),
)
