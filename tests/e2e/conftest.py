"""Fixtures for end-to-end tests against a real control plane (`hack/testenv`).

Every test under tests/e2e is marked `e2e`. One cluster (2 GPU nodes, 1 CPU node) serves the
whole session and is always torn down; each test gets its own namespace and fresh clients.

Skip policy: outside CI, a machine without Go (and without cached binaries) skips e2e with one
line saying so. With CI set, failing to build or start the control plane fails the tests.
Set TESTENV_REUSE=1 to run against a cluster already started with `hack/testenv up`.

Tests marked `real_nodes` share a second cluster with real kubelet nodes (`real_cluster`). A
machine where real nodes cannot run (not root, packages missing) skips them with one line saying
why, except under CI, where that is a failure.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import pytest
from kubernetes import client

from gpu_operator import testenv
from gpu_operator.testenv.releases import OLDEST

E2E_DIR = Path(__file__).resolve().parent
SESSION_GPU_NODES = 2
SESSION_CPU_NODES = 1
SESSION_REAL_NODES = 2

_UNAVAILABLE = pytest.StashKey[str]()  # why the binaries cannot be had, if they cannot
_OLDEST_UNAVAILABLE = pytest.StashKey[str]()  # the same, of the oldest release's
_REAL_UNAVAILABLE = pytest.StashKey[str]()  # why real nodes cannot run, if they cannot


in_ci = testenv.binaries.in_ci


# The kwok modules that run on the oldest release the README claims (releases.OLDEST) as well
# as on the default one: each of their tests runs once on each, but those marked one_release
# (nothing they check depends on the release).
# The real-node modules run on the default release only.
OLDEST_RELEASE_MODULES = frozenset(
    {
        "test_operator.py",
        "test_upgrade.py",
        "test_canary.py",
        "test_health_remediation.py",
        "test_nvidiadriver.py",
        "test_helm.py",
        "test_kubernetes_releases.py",
    }
)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Each test of OLDEST_RELEASE_MODULES, but the one_release ones, on both releases."""
    if (
        metafunc.module.__name__.rpartition(".")[2] + ".py" in OLDEST_RELEASE_MODULES
        and "testenv_bin_dir" in metafunc.fixturenames
        and metafunc.definition.get_closest_marker("one_release") is None
    ):
        default = testenv.binaries.versions()["K8S_VERSION"]
        metafunc.parametrize(
            "kubernetes_release", [default, OLDEST], indirect=True, scope="session"
        )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if E2E_DIR in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.e2e)


LOG_TAIL_LINES = 40  # of each log a failed test leaves: its warnings first, then its end
_NOTABLE = re.compile(r" (WARNING|ERROR|CRITICAL) |Traceback|exited|stopping")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A failed test's report carries the tail of the logs it left in ``tmp_path`` (the
    operator's, the agents'): CI keeps no files, and a wait that timed out says only what it
    saw, not why the process behind it stopped moving."""
    outcome = yield
    report = outcome.get_result()
    tmp = getattr(item, "funcargs", {}).get("tmp_path")
    if report.when != "call" or not report.failed or tmp is None:
        return
    for log in sorted(Path(tmp).rglob("*.log"))[:4]:
        lines = log.read_text(errors="replace").splitlines()
        notable = [line for line in lines if _NOTABLE.search(line)][-LOG_TAIL_LINES // 2 :]
        tail = lines[-LOG_TAIL_LINES // 2 :]
        text = "\n".join([*notable, "...", *tail] if notable else tail)
        report.sections.append((f"{log.name} ({len(lines)} lines): notable, then last", text))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build the binaries here, before any test runs, so a cold build (many minutes) is not
    charged to the first test's timeout."""
    selected = [i for i in session.items if i.get_closest_marker("e2e")]
    if not selected or session.config.option.collectonly:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    _prepare_control_plane(session, selected, reporter)
    oldest = [i for i in selected if _release_of(i) == OLDEST]
    if oldest and session.config.stash.get(_UNAVAILABLE, None) is None:
        _prepare_oldest_release(session, oldest, reporter)
    real = [i for i in selected if i.get_closest_marker("real_nodes")]
    if real and session.config.stash.get(_UNAVAILABLE, None) is None:
        _prepare_real_nodes(session, real, reporter)


def _prepare_control_plane(
    session: pytest.Session, selected: list[pytest.Item], reporter: Any
) -> None:
    reason = testenv.why_unbuildable()
    if reason is None and testenv.binaries.cached_bin_dir() is None:
        log = testenv.default_state_dir() / "build.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        if reporter:
            reporter.write_line(f"testenv: building control-plane binaries (log: {log})")
        try:
            with log.open("w") as out:
                testenv.ensure_binaries(log=out)
        except testenv.BinariesError as exc:
            session.config.stash[_UNAVAILABLE] = f"{exc} (see {log})"
        return
    if reason is None:
        return
    if in_ci():
        session.config.stash[_UNAVAILABLE] = f"CI is set and {reason}"
        return
    if reporter:
        reporter.write_line(f"testenv: skipping {len(selected)} e2e tests: {reason}")
    for item in selected:
        item.add_marker(pytest.mark.skip(reason=reason))


def _release_of(item: pytest.Item) -> str | None:
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("kubernetes_release") if callspec else None


def _prepare_oldest_release(
    session: pytest.Session, items: list[pytest.Item], reporter: Any
) -> None:
    """The oldest release's binaries (as many minutes cold as the default's)."""
    missing = testenv.binaries.cached_bin_dir(OLDEST) is None
    _prepare(
        session, items, reporter, _OLDEST_UNAVAILABLE,
        reason=testenv.binaries.why_unbuildable(OLDEST), skipped=f"tests on {OLDEST}",
        build=(lambda out: testenv.binaries.ensure_binaries(log=out, release=OLDEST))
        if missing else None,
        log_name=f"build-{OLDEST}.log", building=f"Kubernetes {OLDEST}",
    )  # fmt: skip


def _prepare_real_nodes(session: pytest.Session, items: list[pytest.Item], reporter: Any) -> None:
    """The node runtime (containerd, images: about a minute cold)."""
    missing = testenv.binaries.missing_node_parts(testenv.binaries.node_dir())
    _prepare(
        session, items, reporter, _REAL_UNAVAILABLE,
        reason=testenv.realnodes.why_unavailable(testenv.default_state_dir()),
        skipped="real-node tests",
        build=(lambda out: testenv.binaries.ensure_node_runtime(log=out)) if missing else None,
        log_name="build-nodes.log", building="the real nodes' runtime",
    )  # fmt: skip


def _prepare(
    session: pytest.Session,
    items: list[pytest.Item],
    reporter: Any,
    key: pytest.StashKey[str],
    *,
    reason: str | None,
    skipped: str,
    build: Callable[[IO[str]], object] | None,
    log_name: str,
    building: str,
) -> None:
    """What ``items`` need, built (``build``, when something is missing) before any test runs;
    where ``reason`` says it cannot be had here, they are skipped with one line, and under CI
    fail (``key`` keeps why, for their fixture)."""
    if all(i.get_closest_marker("skip") for i in items):
        return
    if reason and in_ci():
        session.config.stash[key] = f"CI is set and {reason}"
        return
    if reason:
        if reporter:
            reporter.write_line(f"testenv: skipping {len(items)} {skipped}: {reason}")
        for item in items:
            item.add_marker(pytest.mark.skip(reason=reason))
        return
    if build is None:
        return
    log = testenv.default_state_dir() / log_name
    log.parent.mkdir(parents=True, exist_ok=True)
    if reporter:
        reporter.write_line(f"testenv: building {building} (log: {log})")
    try:
        with log.open("w") as out:
            build(out)
    except testenv.BinariesError as exc:
        session.config.stash[key] = f"{exc} (see {log})"


@pytest.fixture(scope="session")
def kubernetes_release(request: pytest.FixtureRequest) -> str | None:
    """The release a test's control plane runs: the default (None) unless the test is
    parametrized over releases (OLDEST_RELEASE_MODULES)."""
    release: str | None = getattr(request, "param", None)
    default = testenv.binaries.versions()["K8S_VERSION"]
    return None if release == default else release


@pytest.fixture(scope="session")
def testenv_bin_dir(pytestconfig: pytest.Config, kubernetes_release: str | None) -> Path:
    """The control-plane binaries (of ``kubernetes_release``); fails (never skips) when they
    could not be built."""
    problem = pytestconfig.stash.get(_UNAVAILABLE, None)
    if kubernetes_release is not None:
        problem = problem or pytestconfig.stash.get(_OLDEST_UNAVAILABLE, None)
    if problem:
        pytest.fail(f"testenv unavailable: {problem}", pytrace=False)
    try:
        return testenv.ensure_binaries(release=kubernetes_release)
    except testenv.BinariesError as exc:
        pytest.fail(f"testenv unavailable: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def cluster(testenv_bin_dir: Path) -> Iterator[testenv.Cluster]:
    """The session's control plane with SESSION_GPU_NODES GPU and SESSION_CPU_NODES CPU nodes."""
    if os.environ.get("TESTENV_REUSE"):
        running = testenv.load()
        if running is not None and running.healthy():
            yield running
            return
    state_dir, lock = testenv.claim_state_dir(testenv.default_state_dir(), "e2e")
    try:
        started = testenv.start(
            state_dir,
            gpu_nodes=SESSION_GPU_NODES,
            cpu_nodes=SESSION_CPU_NODES,
            bin_dir=testenv_bin_dir,
        )
    except (testenv.TestenvError, OSError, TimeoutError) as exc:
        lock.close()
        pytest.fail(f"testenv could not start: {exc}", pytrace=False)
    try:
        yield started
    finally:
        started.stop()
        lock.close()


@pytest.fixture(scope="session")
def real_nodes_runtime(pytestconfig: pytest.Config, testenv_bin_dir: Path) -> Path:
    """The real nodes' runtime dir (containerd, images); fails (never skips) when real nodes
    were found unable to run (tests marked `real_nodes` are skipped earlier outside CI)."""
    problem = pytestconfig.stash.get(_REAL_UNAVAILABLE, None)
    if problem:
        pytest.fail(f"real nodes unavailable: {problem}", pytrace=False)
    try:
        return testenv.binaries.ensure_node_runtime()
    except testenv.BinariesError as exc:
        pytest.fail(f"real nodes unavailable: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def real_cluster(real_nodes_runtime: Path, testenv_bin_dir: Path) -> Iterator[testenv.Cluster]:
    """A control plane with SESSION_REAL_NODES real nodes (kubelet, containerd, runc, kube-proxy)
    and one kwok GPU node beside them; fails (never skips) when it cannot start."""
    state_dir, lock = testenv.claim_state_dir(testenv.default_state_dir(), "real-e2e")
    try:
        started = testenv.start(
            state_dir, gpu_nodes=1, real_nodes=SESSION_REAL_NODES, bin_dir=testenv_bin_dir
        )
    except (testenv.TestenvError, OSError, TimeoutError) as exc:
        lock.close()
        pytest.fail(f"testenv with real nodes could not start: {exc}", pytrace=False)
    try:
        yield started
    finally:
        started.stop()
        lock.close()


@pytest.fixture
def api_client(cluster: testenv.Cluster) -> Iterator[client.ApiClient]:
    with cluster.api_client() as api:
        yield api


@pytest.fixture
def core_v1(api_client: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api_client)


@pytest.fixture
def apps_v1(api_client: client.ApiClient) -> client.AppsV1Api:
    return client.AppsV1Api(api_client)


@pytest.fixture
def custom_objects(api_client: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api_client)


@pytest.fixture
def apiextensions_v1(api_client: client.ApiClient) -> client.ApiextensionsV1Api:
    return client.ApiextensionsV1Api(api_client)


@pytest.fixture
def namespace(request: pytest.FixtureRequest, core_v1: client.CoreV1Api) -> Iterator[str]:
    """A fresh namespace named after the test; deleted (not awaited) afterwards."""
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"e2e-{slug}-{uuid.uuid4().hex[:6]}"
    core_v1.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    try:
        core_v1.delete_namespace(name)
    except client.ApiException as exc:
        if exc.status != 404:
            raise


@pytest.fixture
def kube(api_client: client.ApiClient, namespace: str) -> testenv.Clients:
    """Core/Apps/CustomObjects/Apiextensions clients bound to this test's namespace."""
    return testenv.Clients.for_api(api_client, namespace)
