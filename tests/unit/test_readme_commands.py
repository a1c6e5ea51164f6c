"""Every shell command in README.md runs as written, or is listed here with what it needs that a
unit test cannot give it (a cluster, a container engine and registry, PyPI, minutes of build).

The README's ```sh, ```bash and ```console blocks are split into commands (continuation lines
joined, a heredoc kept with its command). A command not listed is run with bash in a scratch
directory holding copies of the repository's examples/ and deploy/, where `gpu-operator` is this
checkout's CLI and no kubeconfig exists, and must exit 0. A command that is neither listed nor
made only of programs that are safe to run here fails the test, and so does a listed command
that left the README: the README's commands cannot drift from the CLI unnoticed. Its links must
resolve too, since its internals moved to docs/.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import prerequisites
from tests.paths import REPO

README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))

CLUSTER = "needs a cluster"
ENGINE = "builds or pushes an image: needs a container engine and a registry"
PYPI = "installs the CLI from PyPI into the environment"
MINUTES = "builds the testenv and takes minutes (tests/e2e/test_real_demo.py runs make demo)"

# The README's commands that are not run here, as the README spells them (compared as tokens,
# comments and quoting dropped). tests/e2e/test_readme.py runs the install, first policy,
# upgrade-status and uninstall commands against a real control plane.
NOT_RUN = {
    CLUSTER: (
        "helm install gpu-operator deploy/helm/gpu-operator -n gpu-operator --create-namespace"
        " --set operator.repository=registry.example.com --set operator.image=gpu-operator"
        " --set operator.version=v0.1.0",
        "helm upgrade gpu-operator deploy/helm/gpu-operator -n gpu-operator --reuse-values"
        " --set driver.version=580.105.08",
        "helm uninstall gpu-operator -n gpu-operator",
        "gpu-operator deploy --image registry.example.com/gpu-operator:v0.1.0"
        " | kubectl apply --server-side -f -",
        "gpu-operator deploy -n gpus --image registry.example.com/gpu-operator:v0.1.0"
        " | kubectl apply --server-side -f -",
        "gpu-operator deploy --image registry.example.com/gpu-operator:v0.1.0"
        " | kubectl delete -f -",
        "gpu-operator upgrade status",
        "gpu-operator upgrade status --watch",
        "gpu-operator health status",
        "kubectl get clusterpolicy",
        "kubectl get clusterpolicy cluster-policy",
        "kubectl -n gpu-operator rollout status deployment/gpu-operator",
        "kubectl apply -f examples/clusterpolicy.yaml",
        "kubectl apply -f examples/gpucluster.yaml",
        "kubectl apply -f examples/dra-pod.yaml",
        "kubectl apply -f examples/computedomain-job.yaml",
        "kubectl get computedomain -n imex-job",
        "kubectl apply -f - <<'EOF'",
        "kubectl logs pod/cuda-smoke",
        "kubectl get nvidiadrivers",
        "kubectl get nodes -L nvidia.com/gpu.driver-pool",
        "kubectl create namespace gpu-operator",
        "kubectl label namespace gpu-operator pod-security.kubernetes.io/enforce=privileged",
        "kubectl delete clusterpolicy --all",
        "kubectl delete gpucluster --all",
        "kubectl delete namespace gpu-operator",
        "operator-sdk run bundle registry.example.com/gpu-operator-bundle:v0.1.0"
        " --namespace gpu-operator --install-mode OwnNamespace",
    ),
    ENGINE: (
        "docker build -t registry.example.com/gpu-operator:v0.1.0 .",
        "docker push registry.example.com/gpu-operator:v0.1.0",
        "podman build -t registry.example.com/gpu-operator:v0.1.0 ."
        " && podman push registry.example.com/gpu-operator:v0.1.0",
        "buildah bud -t registry.example.com/gpu-operator:v0.1.0 ."
        " && buildah push registry.example.com/gpu-operator:v0.1.0",
        "docker build -f my-bundle/bundle.Dockerfile"
        " -t registry.example.com/gpu-operator-bundle:v0.1.0 my-bundle/",
        "docker push registry.example.com/gpu-operator-bundle:v0.1.0",
    ),
    PYPI: ("pipx install .",),
    MINUTES: ("make demo", "make test"),
}

# Programs an unlisted command may consist of: none reaches a cluster or changes the machine.
SAFE = frozenset({"gpu-operator", "cat", "echo", "grep", "head", "diff", "ls", "test"})
HELM_OFFLINE = frozenset({"template", "lint", "show"})

FENCE = re.compile(
    r"^(?P<indent>[ \t]*)```(?P<lang>sh|bash|console)[ \t]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$",
    re.MULTILINE | re.DOTALL,
)
HEREDOC = re.compile(r"<<-?\s*(['\"]?)(\w+)\1")
SEPARATORS = frozenset({"|", "||", "&&", ";"})


def tokens(command_line: str) -> list[str]:
    """The words of a command line as the shell splits them, comments dropped."""
    return shlex.split(command_line.replace("\\\n", " "), comments=True)


@dataclass(frozen=True)
class Command:
    """One command of a README block: where it starts, what bash runs, and its words."""

    line: int
    script: str
    words: tuple[str, ...]

    @property
    def key(self) -> str:
        """How NOT_RUN names it."""
        return " ".join(self.words)

    @property
    def programs(self) -> list[list[str]]:
        """Each pipeline or list member's words, from its program on (VAR=x prefixes dropped)."""
        members: list[list[str]] = [[]]
        for word in self.words:
            if word in SEPARATORS:
                members.append([])
            elif members[-1] or not re.match(r"^\w+=", word):
                members[-1].append(word)
        return [m for m in members if m]


@dataclass(frozen=True)
class Block:
    line: int
    commands: tuple[Command, ...]


def blocks(text: str) -> list[Block]:
    """The shell blocks of a Markdown text, each split into its commands."""
    found = []
    for fence in FENCE.finditer(text):
        first = text.count("\n", 0, fence.start("body")) + 1
        lines = [line[len(fence["indent"]) :] for line in fence["body"].splitlines()]
        commands, i = [], 0
        while i < len(lines):
            start, line = i, lines[i]
            i += 1
            if fence["lang"] == "console":
                if not line.startswith("$ "):
                    continue  # output
                line = line[2:]
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            parts = [line]
            while parts[-1].endswith("\\") and i < len(lines):
                parts.append(lines[i])
                i += 1
            command_line = "\n".join(parts)
            heredoc = HEREDOC.search(command_line)
            if heredoc:
                while i < len(lines) and lines[i].strip() != heredoc[2]:
                    parts.append(lines[i])
                    i += 1
                parts.append(heredoc[2])
                i += 1
            commands.append(Command(first + start, "\n".join(parts), tuple(tokens(command_line))))
        found.append(Block(first, tuple(commands)))
    return found


README_BLOCKS = blocks(README.read_text(encoding="utf-8"))
LISTED = {" ".join(tokens(c)): reason for reason, cs in NOT_RUN.items() for c in cs}


def runnable(command: Command) -> bool:
    """Made only of SAFE programs (and helm's offline subcommands)."""
    return all(
        words[0] in SAFE or (words[0] == "helm" and words[1:2] and words[1] in HELM_OFFLINE)
        for words in command.programs
    )


def to_run(block: Block) -> list[Command]:
    return [c for c in block.commands if c.key not in LISTED and runnable(c)]


def test_every_command_is_run_or_listed() -> None:
    commands = [c for b in README_BLOCKS for c in b.commands]
    assert len(commands) > 20, "the README's shell blocks were not found"
    stray = [
        f"README.md:{c.line}: {c.key}" for c in commands if c.key not in LISTED and not runnable(c)
    ]
    assert not stray, "neither run by this test nor listed in NOT_RUN:\n" + "\n".join(stray)
    gone = sorted(set(LISTED) - {c.key for c in commands})
    assert not gone, "listed in NOT_RUN but no longer in the README:\n" + "\n".join(gone)


def helm_binary() -> str | None:
    """helm on PATH, else the one `hack/testenv build` made for the chart's tests."""
    from gpu_operator.testenv.binaries import cache_bin_dir

    found = shutil.which("helm")
    cached = cache_bin_dir() / "helm"
    return found or (str(cached) if os.access(cached, os.X_OK) else None)


def workspace(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A scratch directory with the repository's examples/ and deploy/, and the environment a
    README command runs in: `gpu-operator` is this checkout's CLI, no cluster is reachable."""
    work = tmp_path / "work"
    work.mkdir()
    for name in ("examples", "deploy"):
        shutil.copytree(REPO / name, work / name)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "gpu-operator"
    shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m gpu_operator "$@"\n')
    shim.chmod(0o755)
    path = [str(bin_dir), os.environ.get("PATH", "")]
    helm = helm_binary()
    if helm is not None:
        path.insert(1, str(Path(helm).parent))
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    env.update(
        PATH=os.pathsep.join(path),
        PYTHONPATH=os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")]),
        KUBECONFIG=str(tmp_path / "no-kubeconfig"),
        HOME=str(tmp_path),
    )
    return work, env


@pytest.mark.parametrize(
    "block", [b for b in README_BLOCKS if to_run(b)], ids=lambda b: f"README.md:{b.line}"
)
def test_the_block_runs_as_written(block: Block, tmp_path: Path) -> None:
    work, env = workspace(tmp_path)
    commands = to_run(block)
    helm = any(words[0] == "helm" for c in commands for words in c.programs)
    if helm and helm_binary() is None:
        prerequisites.absent("needs helm, on PATH or built by `hack/testenv build`")
    for command in commands:
        done = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", command.script],
            cwd=work, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        where = f"README.md:{command.line}: {command.key}"
        assert done.returncode == 0, f"{where}\nexit {done.returncode}\n{done.stderr[-3000:]}"


HEADING = re.compile(r"^#{1,6} (.+)$", re.MULTILINE)
LINK = re.compile(r"\]\(([^)\s]+)\)")
ANY_FENCE = re.compile(r"^[ \t]*```.*?^[ \t]*```", re.MULTILINE | re.DOTALL)


def anchors(path: Path) -> set[str]:
    """GitHub's anchors for the headings of a Markdown file (code blocks left out)."""
    text = ANY_FENCE.sub("", path.read_text(encoding="utf-8"))
    return {
        re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in HEADING.findall(text)
    }


@pytest.mark.parametrize("doc", [README, *DOCS], ids=lambda p: str(p.relative_to(REPO)))
def test_links_resolve(doc: Path) -> None:
    broken = []
    for target in LINK.findall(ANY_FENCE.sub("", doc.read_text(encoding="utf-8"))):
        if re.match(r"^[a-z]+:", target):
            continue  # a web address
        file, _, anchor = target.partition("#")
        path = (doc.parent / file).resolve() if file else doc
        if not path.exists() or (anchor and anchor not in anchors(path)):
            broken.append(target)
    assert not broken, f"{doc.name}: broken links: {broken}"
