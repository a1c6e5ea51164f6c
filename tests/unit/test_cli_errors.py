"""What a new user meets when something is wrong: one line on stderr, ``error: ...``, the exit
code ``gpu-operator --help`` documents, and never a traceback. A table of commands run through
``gpu_operator.cli.main`` in-process, and a few as ``python -m gpu_operator`` processes, against
no kubeconfig, a closed port, and tiny HTTP servers answering as an API server refuses."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import urllib3
import yaml
from kubernetes.client.exceptions import ApiException

from gpu_operator import cli_errors
from gpu_operator.agent.nvml import GpuLost, use_driver_root
from gpu_operator.api import PolicyError
from gpu_operator.cli import main
from gpu_operator.sim.nvml import uninstall_simulated_nvml
from gpu_operator.usage import UsageProblem
from tests.unit.netstubs import answering, closed_port

BAD_INPUT, USAGE, CLUSTER, NO_DRIVER = (
    cli_errors.BAD_INPUT,
    cli_errors.USAGE,
    cli_errors.CLUSTER,
    cli_errors.NO_DRIVER,
)
# What the environment of a developer's shell or a pod could bring in, cleared for each case.
CLEARED = (
    "KUBERNETES_SERVICE_HOST",
    "CONTAINERD_CONFIG",
    "CONFIG_FILE",
    "CONTAINER_DRIVER_ROOT",
    "NVIDIA_DRIVER_ROOT",
    "GPU_OPERATOR_SIMULATE",
    "GPU_OPERATOR_SIMULATE_STATE",
    "LOG_LEVEL",
    "LOG_FORMAT",
    "NODE_NAME",
    "FEATURE_GATES",
    "COMPONENTS",
    "CONFIG_FILE_SRCDIR",
    "FALLBACK_STRATEGIES",
    "KUBELET_SOCKET",
    "GPU_HEALTH_CONDITION",
)
FORBIDDEN = {
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Failure",
    "message": 'clusterpolicies.nvidia.com is forbidden: User "system:anonymous" cannot list '
    'resource "clusterpolicies" in API group "nvidia.com" at the cluster scope',
    "reason": "Forbidden",
    "details": {"group": "nvidia.com", "kind": "clusterpolicies"},
    "code": 403,
}
UNAUTHORIZED = {"kind": "Status", "status": "Failure", "reason": "Unauthorized", "code": 401}
HEALTH_5X = {"GPU_HEALTH_CONDITION": "true", "GPU_HEALTH_QUIET_PERIOD": "5x"}
NO_FALLBACK = {"FALLBACK_STRATEGIES": "bogus"}


def write_kubeconfig(path: Path, server: str) -> str:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "ctx",
    }
    path.write_text(yaml.safe_dump(config))
    return str(path)


@pytest.fixture(scope="module")
def places(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """What the cases' ``{name}`` placeholders stand for: files, and kubeconfigs of servers."""
    root = tmp_path_factory.mktemp("cli-errors")
    (root / "empty").mkdir()
    (root / "utf16.yaml").write_bytes("kind: ClusterPolicy\n".encode("utf-16"))
    (root / "binary").write_bytes(bytes(range(256)))
    (root / "broken.yaml").write_text("version: v1\nmig-configs: [\n")
    files = {"empty": "empty", "utf16": "utf16.yaml", "binary": "binary", "broken": "broken.yaml"}
    found = {name: str(root / file) for name, file in files.items()}
    found["missing"] = str(root / "missing.yaml")
    found["plugins"] = str(root / "empty" / "kubelet.sock")  # the device-plugin dir, no kubelet
    answers = {
        "forbidden": (403, json.dumps(FORBIDDEN).encode()),
        "unauthorized": (401, json.dumps(UNAUTHORIZED).encode()),
        "nocrd": (404, b"404 page not found\n"),  # no nvidia.com group at all
    }
    with contextlib.ExitStack() as servers:
        port = servers.enter_context(closed_port())
        found["closed"] = write_kubeconfig(root / "closed", f"https://127.0.0.1:{port}")
        for name, (status, body) in answers.items():
            url = servers.enter_context(answering(status, body))
            found[name] = write_kubeconfig(root / name, url)
        yield found


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A clean environment, and afterwards pytest's own SIGTERM and SIGINT handlers back (an
    agent that gets as far as its stop event installs its own)."""
    for name in CLEARED:
        monkeypatch.delenv(name, raising=False)
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    yield
    for signum, handler in handlers.items():
        signal.signal(signum, handler)
    uninstall_simulated_nvml()
    use_driver_root(None)


def command(line: str, places: dict[str, str]) -> list[str]:
    return shlex.split(line.format(**places))


def in_process(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> tuple[int | str | None, str, str]:
    """``main(argv)``'s exit code (argparse's too: it exits), stdout and stderr."""
    try:
        code: int | str | None = main(argv)
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_error_line(expected: int, code: int | str | None, out: str, err: str) -> None:
    assert "Traceback" not in out + err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    assert code == expected, err


CASES = [
    # No cluster: no kubeconfig anywhere, and not in a pod.
    ("upgrade status", CLUSTER, {}),
    ("health status", CLUSTER, {}),
    ("uninstall --wait", CLUSTER, {}),
    ("crd --apply", CLUSTER, {}),
    ("run --no-leader-election", CLUSTER, {}),
    ("upgrade status --kubeconfig {missing}", CLUSTER, {}),
    ("upgrade status --kubeconfig {closed} --context nope", CLUSTER, {}),
    ("health status --kubeconfig {utf16}", CLUSTER, {}),
    # The server does not answer: a closed port.
    ("upgrade status", CLUSTER, {"KUBECONFIG": "{closed}"}),
    ("health status -o json", CLUSTER, {"KUBECONFIG": "{closed}"}),
    # The server answers no: 403 (RBAC), 401 (credentials), 404 (no CRDs).
    ("upgrade status", CLUSTER, {"KUBECONFIG": "{forbidden}"}),
    ("health status --kubeconfig {forbidden}", CLUSTER, {}),
    ("uninstall --kubeconfig {forbidden}", CLUSTER, {}),
    ("crd --apply --kubeconfig {forbidden}", CLUSTER, {}),
    ("upgrade status --kubeconfig {unauthorized}", CLUSTER, {}),
    ("upgrade status --kubeconfig {nocrd}", CLUSTER, {}),
    ("health status --kubeconfig {nocrd}", CLUSTER, {}),
    # (a device plugin whose config the node's label picks reads the Node first)
    (
        "agent device-plugin --simulate t4:1 --kubelet-socket {plugins} --config-dir {empty} "
        "--node-name n --kubeconfig {forbidden}",
        CLUSTER,
        {},
    ),
    (  # ...and a node the API server does not know is a wrong NODE_NAME
        "agent device-plugin --simulate t4:1 --kubelet-socket {plugins} --config-dir {empty} "
        "--node-name n --kubeconfig {nocrd}",
        USAGE,
        {},
    ),
    # Files that are missing, not UTF-8, not YAML.
    ("render -f {missing}", BAD_INPUT, {}),
    ("render -f {utf16}", BAD_INPUT, {}),
    ("render -f {binary}", BAD_INPUT, {}),
    ("migrate -f {utf16}", BAD_INPUT, {}),
    ("bundle --version 0.1.0 --example {utf16}", BAD_INPUT, {}),
    ("agent mig-parted plan -f {utf16} --simulate a100-40gb:1", BAD_INPUT, {}),
    ("agent mig-parted plan -f {broken} --simulate a100-40gb:1", BAD_INPUT, {}),
    ("agent mig-parted apply -f {missing} --simulate a100-40gb:1", BAD_INPUT, {}),
    ("agent exporter --collectors {binary} --simulate t4:1", BAD_INPUT, {}),
    (
        "agent device-plugin --simulate t4:1 --kubelet-socket {empty}/nope/kubelet.sock",
        BAD_INPUT,
        {},
    ),
    (
        "agent device-plugin --simulate t4:1 --kubelet-socket {plugins} --config-file {broken}",
        BAD_INPUT,
        {},
    ),
    ("agent validate --simulate l4:1 --components driver --output-dir {binary}/v", BAD_INPUT, {}),
    # Values: unknown profiles, durations, log settings.
    ("agent discover --simulate nope:2 --oneshot --output-file -", BAD_INPUT, {}),
    ("agent nvml-info --simulate nope:1", BAD_INPUT, {}),
    ("agent discover --simulate t4:1 --oneshot --output-file - --sleep-interval 5x", 1, {}),
    ("agent nvml-info --simulate t4:1", BAD_INPUT, {"LOG_LEVEL": "bogus"}),
    ("agent nvml-info --simulate t4:1", BAD_INPUT, {"LOG_FORMAT": "xml"}),
    ("agent device-plugin --simulate t4:1", BAD_INPUT, HEALTH_5X),
    (
        "agent dra-plugin --node-name n --feature-gates NVMLDeviceHealthCheck=true",
        BAD_INPUT,
        HEALTH_5X,
    ),
    ("agent device-plugin --simulate t4:1 --config-dir {empty}", BAD_INPUT, NO_FALLBACK),
    ("agent mps-control-daemon --simulate t4:1 --config-dir {empty}", BAD_INPUT, NO_FALLBACK),
    ("agent discover --simulate t4:1 --oneshot --config-dir {empty}", BAD_INPUT, NO_FALLBACK),
    # Usage: bad option values, missing options, stand-ins without where to write.
    ("uninstall --timeout 5x", USAGE, {}),
    ("uninstall --timeout=", USAGE, {}),
    ("deploy -o xml", USAGE, {}),
    ("upgrade status -o xml", USAGE, {}),
    ("run --log-format xml", USAGE, {}),
    ("bundle", USAGE, {}),
    ("", USAGE, {}),
    ("agent simulate-toolkit", USAGE, {}),
    ("agent simulate-driver", USAGE, {}),
    ("agent simulate-driver manager", USAGE, {}),
    ("agent simulate-driver install", USAGE, {}),
    ("agent simulate-fault --gpu 0 xid 79", USAGE, {}),
    ("agent mig-parted plan --simulate a100-40gb:1", USAGE, {}),
    ("agent dra-plugin", USAGE, {}),
    ("agent dra-plugin --node-name n --feature-gates Bogus=true", USAGE, {}),
    ("agent compute-domain-plugin", USAGE, {}),
    ("agent compute-domain-plugin --node-name n --healthcheck-port 70000", USAGE, {}),
    ("agent compute-domain-plugin --node-name n", USAGE, {"HEALTHCHECK_PORT": "http"}),
    ("agent compute-domain-plugin --node-name n --prepare-timeout 0", USAGE, {}),
    ("agent mps-claim-daemon --driver-root=", USAGE, {}),  # the default is /: only given empty
    ("agent device-plugin --kwok-capacity", USAGE, {}),
    ("agent device-plugin --kwok-capacity --simulate t4:1", USAGE, {}),
    ("agent mig-manager", USAGE, {}),
    ("agent validate --components driver,bogus", USAGE, {}),
    # No GPU driver under the driver root.
    ("agent nvml-info --driver-root {empty}", NO_DRIVER, {}),
    ("agent exporter --driver-root {empty}", NO_DRIVER, {}),
    ("agent discover --oneshot --output-file - --driver-root {empty}", NO_DRIVER, {}),
    ("agent mig-parted generate --driver-root {empty}", NO_DRIVER, {}),
    ("agent cdi list --driver-root {empty}", NO_DRIVER, {}),
    ("agent device-plugin --driver-root {empty} --kubelet-socket {plugins}", NO_DRIVER, {}),
]


@pytest.mark.parametrize(("line", "code", "env"), CASES, ids=[c[0] or "-" for c in CASES])
def test_each_failure_is_one_line_and_its_exit_code(
    line: str,
    code: int,
    env: dict[str, str],
    places: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if "mig-parted plan --simulate" in line and os.path.exists("/mig-parted-config/config.yaml"):
        pytest.skip("this machine has the default mig-parted config")
    monkeypatch.setenv("KUBECONFIG", places["missing"])
    for name, value in env.items():
        monkeypatch.setenv(name, value.format(**places))
    assert_one_error_line(code, *in_process(command(line, places), capsys))


def test_cases_cover_every_exit_code_but_done() -> None:
    assert len(CASES) >= 30
    assert {code for _, code, _ in CASES} == {BAD_INPUT, USAGE, CLUSTER, NO_DRIVER}


PROCESS_CASES = [
    ("upgrade status", CLUSTER, {}),
    ("health status", CLUSTER, {"KUBECONFIG": "{closed}"}),
    ("uninstall --wait", CLUSTER, {"KUBECONFIG": "{forbidden}"}),
    ("render -f {utf16}", BAD_INPUT, {}),
    ("agent simulate-toolkit", USAGE, {}),
    ("agent nvml-info --driver-root {empty}", NO_DRIVER, {}),
]


def process(
    line: str, env: dict[str, str], places: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in CLEARED}
    extra = {name: value.format(**places) for name, value in env.items()}
    return subprocess.run(
        [sys.executable, "-m", "gpu_operator", *command(line, places)],
        capture_output=True,
        text=True,
        env={**clean, "KUBECONFIG": places["missing"], **extra},
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(("line", "code", "env"), PROCESS_CASES, ids=[c[0] for c in PROCESS_CASES])
def test_a_process_prints_no_traceback(
    line: str, code: int, env: dict[str, str], places: dict[str, str]
) -> None:
    done = process(line, env, places)
    assert_one_error_line(code, done.returncode, done.stdout, done.stderr)


def test_what_each_line_says(
    places: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The what and the what-to-do of the cases a new user meets first."""

    def said(line: str) -> str:
        return in_process(command(line, places), capsys)[2]

    monkeypatch.setenv("KUBECONFIG", places["missing"])
    assert "set KUBECONFIG or pass --kubeconfig" in said("upgrade status")
    server = yaml.safe_load(Path(places["closed"]).read_text())["clusters"][0]["cluster"]["server"]
    assert f"at {server}: connection refused" in said("upgrade status --kubeconfig {closed}")
    forbidden = said("uninstall --kubeconfig {forbidden}")
    assert "RBAC to list clusterpolicies.nvidia.com (a ClusterRole" in forbidden
    assert "run `gpu-operator crd --apply`" in said("upgrade status --kubeconfig {nocrd}")
    assert "driver container" in said("agent nvml-info --driver-root {empty}")
    assert "known: a100-40gb, a100-80gb" in said("agent nvml-info --simulate nope:1")
    simulated = "--simulate a100-40gb:1"
    assert "UTF-16 little-endian" in said(f"agent mig-parted plan -f {{utf16}} {simulated}")
    assert "line 3, column 1" in said(f"agent mig-parted plan -f {{broken}} {simulated}")
    assert "needs --containerd-config" in said("agent simulate-toolkit")
    assert "--node-name or env NODE_NAME" in said("agent dra-plugin")
    assert "it needs --simulate" in said("agent device-plugin --kwok-capacity")
    assert "mount the kubelet's device-plugin directory" in said(
        "agent device-plugin --simulate t4:1 --kubelet-socket {empty}/nope/kubelet.sock"
    )


@pytest.mark.parametrize("how", ["--debug", "LOG_LEVEL=debug"])
def test_debug_adds_the_traceback_before_the_line(
    how: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    places: dict[str, str],
) -> None:
    monkeypatch.setenv("KUBECONFIG", places["missing"])
    argv = ["upgrade", "status"]
    if how == "--debug":
        argv.append(how)
    else:
        monkeypatch.setenv("LOG_LEVEL", "debug")  # any case, as the agents always took it
    code, _, err = in_process(argv, capsys)
    assert code == CLUSTER
    assert err.startswith("Traceback") and "ClusterConfigError" in err
    assert err.splitlines()[-1].startswith("error: no cluster to talk to")


def test_log_level_is_read_in_any_case(places: dict[str, str]) -> None:
    done = process("agent nvml-info --simulate t4:1 -o json", {"LOG_LEVEL": "debug"}, places)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["gpus"][0]["name"] == "Tesla T4"


def api_error(status: int, body: str = "", request: str = "") -> ApiException:
    exc = ApiException(status=status, reason="Reason", body=body)
    if request:
        exc.request_line = request  # as gpu_operator.kube sets it
    return exc


def timed_out() -> urllib3.exceptions.MaxRetryError:
    pool = urllib3.HTTPSConnectionPool("api.example", 6443)
    reason = urllib3.exceptions.ReadTimeoutError(pool, "/api", "read timed out")
    return urllib3.exceptions.MaxRetryError(pool, "/api", reason)


def yaml_error() -> yaml.YAMLError:
    try:
        yaml.safe_load("a: 1\n  b: [")
    except yaml.YAMLError as exc:
        return exc
    raise AssertionError("valid YAML")


@pytest.mark.parametrize(
    ("exc", "code", "said"),
    [
        (
            api_error(403, "not JSON", "PATCH /api/v1/namespaces/gpus/configmaps/c"),
            CLUSTER,
            "RBAC to patch configmaps (a Role and RoleBinding in namespace gpus granting it)",
        ),
        (api_error(403, "", "GET /apis/apps/v1/daemonsets"), CLUSTER, "to list daemonsets.apps"),
        (api_error(503, "", "GET /api/v1/nodes"), CLUSTER, "503 Reason for GET /api/v1/nodes"),
        (api_error(422, '{"message": "spec: bad"}'), BAD_INPUT, "refused the request: 422"),
        (ApiException(status=0, reason="SSLError\nbad cert"), CLUSTER, "TLS to the API server"),
        (timed_out(), CLUSTER, "at https://api.example:6443: it took the connection but"),
        (GpuLost(15, "nvmlDeviceGetHandle"), NO_DRIVER, "NVML failed: nvmlDeviceGetHandle"),
        (yaml_error(), BAD_INPUT, "not valid YAML at line 2, column 4"),
        (PermissionError(13, "Permission denied", "/x"), BAD_INPUT, "/x: Permission denied"),
        (PolicyError(["spec.a: bad", "spec.b: worse"]), BAD_INPUT, "spec.a: bad; spec.b: worse"),
        (KeyboardInterrupt(), cli_errors.INTERRUPTED, "error: interrupted"),
        (UsageProblem("x needs --y", "pass --y (env Y)"), USAGE, "error: x needs --y: pass --y"),
        (UsageProblem("x needs --y"), USAGE, "error: x needs --y"),
        (RuntimeError("boom\n  at line two"), BAD_INPUT, "RuntimeError: boom at line two: an"),
    ],
)
def test_explain(exc: BaseException, code: int, said: str) -> None:
    got, line = cli_errors.explain(exc)
    assert (got, "\n" in line, line.startswith("error: ")) == (code, False, True)
    assert said in line, line


def test_the_exit_codes_the_help_lists_are_those_explained() -> None:
    text = cli_errors.exit_codes_text()
    codes = [int(line.split()[0]) for line in text.splitlines()[1:] if line[2:3].isdigit()]
    assert codes == [code for code, _ in cli_errors.EXIT_CODES] == [0, 1, 2, 3, 4, 130]
