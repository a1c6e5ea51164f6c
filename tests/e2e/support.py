"""Helpers shared by the operator e2e tests: private clusters, identities, waiting, auditing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from gpu_operator import testenv
from gpu_operator.controller.runner import OperatorThread, RunOptions
from gpu_operator.controller.runtime.config import OperatorConfig
from gpu_operator.install.manifests import namespace_object
from gpu_operator.kube import Kube

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[2]
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}


@contextmanager
def private_cluster(
    bin_dir: Path, gpu_nodes: int = 0, cpu_nodes: int = 0
) -> Iterator[testenv.Cluster]:
    """A control plane of its own, for tests that own cluster-scoped state (nodes, policies)."""
    state = testenv.default_state_dir() / f"op-{uuid.uuid4().hex[:8]}"
    cluster = testenv.start(state, gpu_nodes=gpu_nodes, cpu_nodes=cpu_nodes, bin_dir=bin_dir)
    try:
        yield cluster
    finally:
        cluster.stop(remove_state=True)


# The operator's ServiceAccount (deploy/'s) as the audit log names it: its requests are found so.
OPERATOR_USER = "system:serviceaccount:gpu-operator:gpu-operator"


class NotYet:
    """A probe's "not yet" that says what it saw, so a wait that times out reports it.

    Falsy: ``return NotYet(status)`` where a probe would return None or False."""

    def __init__(self, seen: Any) -> None:
        self.seen = seen

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"{self.seen!r}" if not isinstance(self.seen, str) else self.seen


def wait_for(
    what: str, probe: Callable[[], T | NotYet | None], timeout: float = 60.0, every: float = 0.3
) -> T:
    """Poll ``probe`` until it returns something truthy; fail naming ``what`` and what the
    probe last saw (its last value: a ``NotYet`` carries what it saw)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last  # type: ignore[return-value]
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last saw: {last!r}")


def api_served(kube: Kube, kind: str) -> bool | NotYet:
    """True once ``kind`` can be listed: a CRD object appears before its API is served."""
    try:
        kube.list_objects(kind)
    except ApiException as exc:
        if exc.status == 404:
            return NotYet(f"listing {kind}s: 404, the CRD's API not served yet")
        raise
    return True


def policy_api_served(kube: Kube) -> bool | NotYet:
    """True once ClusterPolicies can be listed."""
    return api_served(kube, "ClusterPolicy")


def still_there(obj: Mapping[str, Any]) -> NotYet:
    """What a wait for ``obj`` to go reports of it: whether its deletion began, what holds it."""
    return NotYet({k: obj["metadata"].get(k) for k in ("name", "deletionTimestamp", "finalizers")})


def node_events(kube: Kube, node: str) -> list[dict[str, Any]]:
    """Events about ``node``, by the query `kubectl describe node` makes (the kubelet's
    convention: involvedObject.uid is the node's name)."""
    selector = (
        f"involvedObject.kind=Node,involvedObject.name={node},"
        f"involvedObject.namespace=,involvedObject.uid={node}"
    )
    return kube.list_objects("Event", None, field_selector=selector)


def object_events(kube: Kube, kind: str, name: str = "") -> list[dict[str, Any]]:
    """Events about the cluster-scoped ``kind`` (named ``name``, or any): the operator records
    them in the ``default`` namespace, as kube-apiserver's own clients do."""
    selector = f"involvedObject.kind={kind}" + (f",involvedObject.name={name}" if name else "")
    return kube.list_objects("Event", "default", field_selector=selector)


def events_with(
    what: str,
    events: Callable[[], list[dict[str, Any]]],
    *reasons: str,
    timeout: float = 60.0,
) -> list[dict[str, Any]]:
    """Wait until ``events()`` holds an Event of each of ``reasons``, and return them all.

    An Event is its own write, made after the change it reports: a test that waited for the
    change (a label, a status) must wait for the Event too, not read the Events once."""

    def probe() -> list[dict[str, Any]] | NotYet:
        found = events()
        seen = [e["reason"] for e in found]
        return found if all(r in seen for r in reasons) else NotYet(seen)

    return wait_for(f"{what}: Events {', '.join(reasons)}", probe, timeout=timeout)


def service_account_config(
    cluster: testenv.Cluster, namespace: str, name: str, cluster_role: str = "cluster-admin"
) -> k8s.Configuration:
    """Credentials of a ServiceAccount bound to ``cluster_role`` (a token, as in a real pod)."""
    with cluster.api_client() as api:
        kube = Kube(api)
        if kube.get("Namespace", namespace) is None:
            kube.create(namespace_object(namespace))  # labelled as an install labels it
        if kube.get("ServiceAccount", name, namespace) is None:
            kube.create(
                {
                    "apiVersion": "v1",
                    "kind": "ServiceAccount",
                    "metadata": {"name": name, "namespace": namespace},
                }
            )
        binding = f"{namespace}-{name}-{cluster_role}"
        if cluster_role and kube.get("ClusterRoleBinding", binding) is None:
            kube.create(
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "ClusterRoleBinding",
                    "metadata": {"name": binding},
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "ClusterRole",
                        "name": cluster_role,
                    },
                    "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
                }
            )
        token = kube.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
            body={
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": 7200},
            },
        )["status"]["token"]
    config = k8s.Configuration(host=cluster.api_url, ssl_ca_cert=str(cluster.ca_file))
    config.api_key = {"authorization": f"Bearer {token}"}
    return config


def token_kubeconfig(cluster: testenv.Cluster, config: k8s.Configuration, path: Path) -> Path:
    """A kubeconfig file carrying ``config``'s token, for an operator run as its own process."""
    token = config.api_key["authorization"].split(" ", 1)[1]
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "testenv",
                        "cluster": {
                            "server": cluster.api_url,
                            "certificate-authority": str(cluster.ca_file),
                        },
                    }
                ],
                "users": [{"name": "operator", "user": {"token": token}}],
                "contexts": [
                    {"name": "testenv", "context": {"cluster": "testenv", "user": "operator"}}
                ],
                "current-context": "testenv",
            }
        )
    )
    return path


def start_operator(config: k8s.Configuration, namespace: str, **settings: Any) -> OperatorThread:
    options = RunOptions(
        config=OperatorConfig(namespace=namespace, **settings),
        metrics_port=None,
        health_endpoint=None,
        renew_seconds=2.0,
        lease_seconds=6,
    )
    # Restarted when it stops on its own (a Lease renewal late on a loaded machine), as its
    # Deployment would be: a test then sees a restart, not an operator gone for the rest of it.
    return OperatorThread(options, config, restart=True).start()


def audit_writes(
    cluster: testenv.Cluster,
    username: str | None,
    since: datetime,
    *,
    resource: tuple[str, str | None] | None = None,
) -> list[Mapping[str, Any]]:
    """Write requests ``username`` (None: anyone) made since ``since`` (to ``resource``, as
    (plural, name), when given; a name of None: any object of that plural), from the
    apiserver's audit log."""
    return audit_requests(cluster, username, since, resource=resource, verbs=WRITE_VERBS)


def audit_requests(
    cluster: testenv.Cluster,
    username: str | None,
    since: datetime,
    *,
    resource: tuple[str, str | None] | None = None,
    verbs: Collection[str] | None = None,
) -> list[Mapping[str, Any]]:
    """Requests (of ``verbs``; None: any) as :func:`audit_writes` selects them."""
    out = []
    with cluster.audit_log.open() as log:
        for line in log:
            event = json.loads(line)
            if event.get("stage") != "ResponseComplete":
                continue
            if verbs is not None and event.get("verb") not in verbs:
                continue
            if username is not None and event.get("user", {}).get("username") != username:
                continue
            ref = event.get("objectRef") or {}
            if resource is not None and (
                ref.get("resource") != resource[0] or resource[1] not in (None, ref.get("name"))
            ):
                continue
            stamp = datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00"))
            if stamp >= since:
                out.append(event)
    return out


def audit_refusals(cluster: testenv.Cluster, username: str) -> list[Mapping[str, Any]]:
    """Requests of ``username`` the apiserver refused with 403 Forbidden, from its audit log."""
    out = []
    with cluster.audit_log.open() as log:
        for line in log:
            if '"code":403' not in line or username not in line:
                continue  # most lines: parse only the candidates
            event = json.loads(line)
            if event.get("stage") != "ResponseComplete":
                continue
            if event.get("user", {}).get("username") != username:
                continue
            if (event.get("responseStatus") or {}).get("code") == 403:
                out.append(event)
    return out


def now() -> datetime:
    return datetime.now(UTC)


def policy_status(kube: Kube, name: str) -> dict[str, Any]:
    obj = kube.get("ClusterPolicy", name) or {}
    status: dict[str, Any] = obj.get("status") or {}
    return status


def policy_ready(kube: Kube, name: str = "cluster-policy") -> dict[str, Any] | NotYet:
    """The ClusterPolicy's status once its state is ready; else what the status says."""
    status = policy_status(kube, name)
    return status if status.get("state") == "ready" else NotYet(status)


def hack_testenv(state_dir: Path, bin_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`hack/testenv --state-dir STATE_DIR ARGS...` with the given binaries, as a user runs it."""
    return subprocess.run(
        [str(REPO / "hack" / "testenv"), "--state-dir", str(state_dir), *args],
        env={**os.environ, "TESTENV_BIN_DIR": str(bin_dir)},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


class OperatorProcess:
    """``gpu-operator run`` as its own process (out of cluster, as a ServiceAccount through
    ``kubeconfig``), so a test can really kill it; restarted when it exits on its own, as the
    kubelet restarts a Deployment's container (a leader that lost its Lease on a starved CI
    machine stops acting and exits, by design). Each such exit's code is kept in ``exits``
    and told in the log."""

    RESTART_BACKOFF_S = 1.0

    def __init__(
        self,
        kubeconfig: Path,
        log: Path,
        namespace: str,
        metrics_port: int = 0,
        *,
        health_port: int = 0,
        lease_seconds: int = 6,
        install_crd: bool = True,
    ) -> None:
        self.kubeconfig, self.log, self.namespace = kubeconfig, log, namespace
        self.metrics_port = metrics_port  # 0: none
        self.health_port = health_port  # 0: none
        self.args = ["--lease-duration", str(lease_seconds)]
        if not install_crd:
            self.args.append("--no-install-crd")
        self.proc: subprocess.Popen[bytes] | None = None
        self.exits: list[int] = []
        self._supervise = threading.Event()
        self._thread: threading.Thread | None = None

    def _spawn(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gpu_operator", "run", "--kubeconfig", str(self.kubeconfig),
                 "--namespace", self.namespace, "--health-port", str(self.health_port),
                 "--metrics-port", str(self.metrics_port), *self.args],
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def start(self) -> OperatorProcess:
        self._spawn()
        self._supervise.set()
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._watch, daemon=True)
            self._thread.start()
        return self

    def _watch(self) -> None:
        while self._supervise.is_set():
            proc = self.proc
            if proc is not None and proc.poll() is not None and self._supervise.is_set():
                self.exits.append(proc.returncode)
                with self.log.open("a") as out:
                    out.write(f"test harness: the operator exited ({proc.returncode}); "
                              "restarting it as the kubelet would\n")  # fmt: skip
                time.sleep(self.RESTART_BACKOFF_S)
                if self._supervise.is_set():
                    self._spawn()
            time.sleep(0.1)

    def metrics(self) -> dict[str, float]:
        """Its Prometheus samples, ``name{labels}`` -> value; empty while it cannot answer."""
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5
            ) as r:
                text = r.read().decode()
        except OSError:
            return {}
        samples = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                samples[name] = float(value)
        return samples

    def healthz(self) -> tuple[int, dict[str, Any]]:
        """Its /healthz answer (status, body); (0, {}) while it cannot answer."""
        url = f"http://127.0.0.1:{self.health_port}/healthz"
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")
        except OSError:
            return 0, {}

    def kill(self, sig: int = signal.SIGKILL, *, restart: bool = False) -> None:
        """``sig`` to the running process, no goodbye: a successor waits for the Lease to
        expire. With ``restart`` the supervisor starts that successor, else :meth:`start`
        does."""
        if not restart:
            self._supervise.clear()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            if not restart:
                self.proc.wait(10)

    def stop(self) -> None:
        """A graceful stop (SIGTERM: the Lease is handed over), not restarted."""
        self._supervise.clear()
        if self._thread is not None:
            self._thread.join(5)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
