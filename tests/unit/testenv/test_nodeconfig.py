"""The real nodes' plan and configuration files, as data: the settings that make a kubelet,
containerd and kube-proxy run in namespaces on this kind of VM, and the addressing that keeps
every packet on the machine."""

from __future__ import annotations

import ipaddress
import re
import subprocess
import tomllib
from pathlib import Path

import pytest

from gpu_operator.sim.nvml.profiles import available_profiles
from gpu_operator.testenv import binaries, nodeconfig, nodes, realnodes
from gpu_operator.testenv.nodeconfig import NodeConfigError

REPO = Path(__file__).resolve().parents[3]
STATE = Path("/work/x/.testenv/e2e")


def _plan(
    count: int = 3, gpus: tuple[str, ...] = ("a100-40gb:8", "t4:1")
) -> list[nodeconfig.RealNode]:
    return nodeconfig.plan_nodes(count, gpus, nodeconfig.network_for_slot(7), STATE / "nodes")


def test_network_slot_addresses_and_names() -> None:
    net = nodeconfig.network_for_slot(7)
    assert (net.bridge, net.subnet, net.gateway, net.prefix_len) == (
        "gpuopbr7", "10.213.7.0/24", "10.213.7.1", 24,
    )  # fmt: skip
    assert nodeconfig.Network.from_json(net.to_json()) == net
    with pytest.raises(NodeConfigError):
        nodeconfig.network_for_slot(256)


def test_pick_slot_skips_used_subnets_and_bridges() -> None:
    used = ["127.0.0.1/8", "10.213.0.1/24", "10.213.1.77/16", "192.0.2.2/24", "garbage"]
    # 10.213.1.77/16 overlaps every 10.213.X.0/24: nothing is free.
    with pytest.raises(NodeConfigError, match="no free"):
        nodeconfig.pick_slot(used, [])
    assert nodeconfig.pick_slot(["10.213.0.1/24", "10.213.2.1/24"], ["gpuopbr1", "eth0"]) == 3
    assert nodeconfig.pick_slot([], []) == 0


def test_plan_names_addresses_and_cycled_gpus() -> None:
    planned = _plan()
    assert [n.name for n in planned] == ["real-node-0", "real-node-1", "real-node-2"]
    assert [n.ip for n in planned] == ["10.213.7.10", "10.213.7.11", "10.213.7.12"]
    assert [n.gpus for n in planned] == ["a100-40gb:8", "t4:1", "a100-40gb:8"]
    assert [n.dir for n in planned] == [STATE / "nodes" / n.name for n in planned]
    pod_nets = [ipaddress.ip_network(n.pod_cidr) for n in planned]
    assert all(net.subnet_of(ipaddress.ip_network(nodeconfig.CLUSTER_CIDR)) for net in pod_nets)
    assert len({str(n) for n in pod_nets}) == 3
    for node in planned:
        assert len(node.host_veth) <= 15 and len(node.node_veth) <= 15  # IFNAMSIZ
        assert ipaddress.ip_address(node.ip) in ipaddress.ip_network("10.213.7.0/24")
        assert nodeconfig.RealNode.from_json(node.to_json()) == node


def test_plan_rejects_bad_counts() -> None:
    net = nodeconfig.network_for_slot(0)
    with pytest.raises(NodeConfigError, match="--real-nodes -1"):
        nodeconfig.plan_nodes(-1, ["t4:1"], net, STATE)
    with pytest.raises(NodeConfigError, match="at most"):
        nodeconfig.plan_nodes(300, ["t4:1"], net, STATE)
    with pytest.raises(NodeConfigError, match="--real-node-gpus"):
        nodeconfig.plan_nodes(1, [], net, STATE)
    assert nodeconfig.plan_nodes(0, [], net, STATE) == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, list(nodeconfig.DEFAULT_GPUS)),
        ("", list(nodeconfig.DEFAULT_GPUS)),
        ("a100-40gb:8,h100-80gb:8", ["a100-40gb:8", "h100-80gb:8"]),
        ("a100-40gb:4+t4:2, t4", ["a100-40gb:4,t4:2", "t4"]),
        (
            "gb200:4+fabric=6f2e2f0a-5d4c-4b7e-9a51-0c2d4e6f8a10.1,gb200:4",
            ["gb200:4,fabric=6f2e2f0a-5d4c-4b7e-9a51-0c2d4e6f8a10.1", "gb200:4"],
        ),
    ],
)
def test_parse_gpus(text: str | None, expected: list[str]) -> None:
    assert nodeconfig.parse_gpus(text, available_profiles()) == expected


def test_the_fabric_item_is_spelled_as_the_simulation_spells_it() -> None:
    from gpu_operator.sim.nvml.profiles import FABRIC_ITEM

    assert nodeconfig.FABRIC_ITEM == FABRIC_ITEM


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("v100:8", "unknown GPU profile 'v100'"),
        ("a100-40gb:x", "bad count in 'a100-40gb:x'"),
        ("a100-40gb:0", "bad count"),
        ("a100-40gb:8,,t4:1", "empty entry"),
    ],
)
def test_parse_gpus_names_the_option_and_the_fix(text: str, message: str) -> None:
    with pytest.raises(NodeConfigError, match=re.escape(message)) as err:
        nodeconfig.parse_gpus(text, available_profiles())
    assert "--real-node-gpus" in str(err.value)


def test_testenv_knows_the_agents_gpu_profiles() -> None:
    assert realnodes.known_gpu_profiles() == available_profiles()


def test_labels_mark_real_gpu_nodes_like_kwok_ones() -> None:
    node = _plan(1)[0]
    labels = nodeconfig.node_labels(node)
    kwok = nodes.node_manifest(node.name, gpu=True)["metadata"]["labels"]
    assert labels == {**kwok, nodeconfig.REAL_NODE_LABEL: "true"}
    assert labels[nodes.GPU_PRESENT_LABEL] == "true"
    assert nodeconfig.node_annotations(node) == {
        nodeconfig.SIMULATED_GPUS_ANNOTATION: "a100-40gb:8"
    }


def test_kwok_nodes_have_loopback_addresses() -> None:
    """The API server dials InternalIPs (for the real nodes); a kwok node's must not leave."""
    for name in ("gpu-node-0", "cpu-node-7", "x" * 60):
        status = nodes.node_manifest(name, gpu=True)["status"]
        ip = next(a["address"] for a in status["addresses"] if a["type"] == "InternalIP")
        assert ipaddress.ip_address(ip).is_loopback, ip


def test_kubelet_config_settings_that_matter_here() -> None:
    node = _plan(1)[0]
    cfg = nodeconfig.kubelet_config(node, ca_file=Path("/ca.crt"), resolv_conf=Path("/r"))
    assert cfg["kind"] == "KubeletConfiguration"
    assert cfg["address"] == node.ip  # the API server reaches it over the bridge
    assert cfg["containerRuntimeEndpoint"] == "unix:///run/containerd/containerd.sock"
    assert cfg["authentication"]["x509"]["clientCAFile"] == "/ca.crt"
    assert cfg["authentication"]["anonymous"]["enabled"] is False
    assert cfg["authorization"]["mode"] == "Webhook"
    expected = {
        "cgroupDriver": "cgroupfs",
        "cgroupsPerQOS": False,
        "enforceNodeAllocatable": [],
        "failSwapOn": False,
        "failCgroupV1": False,
        "makeIPTablesUtilChains": False,
        "evictionHard": {},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "localStorageCapacityIsolation": True,
        "oomScoreAdj": 0,
        "resolvConf": "/r",
    }
    assert {k: cfg[k] for k in expected} == expected


def test_kube_proxy_config_leaves_global_conntrack_alone() -> None:
    node = _plan(1)[0]
    cfg = nodeconfig.kube_proxy_config(node, Path("/kp.kubeconfig"))
    assert cfg["hostnameOverride"] == node.name
    assert cfg["mode"] == "iptables"
    assert cfg["clusterCIDR"] == nodeconfig.CLUSTER_CIDR
    assert cfg["conntrack"]["maxPerCore"] == 0 and cfg["oomScoreAdj"] == 0
    assert cfg["clientConnection"]["kubeconfig"] == "/kp.kubeconfig"


def test_cni_bridge_masquerades_and_stays_in_the_node() -> None:
    node = _plan(2)[1]
    conf = nodeconfig.cni_conflist(node)
    bridge = conf["plugins"][0]
    assert bridge["type"] == "bridge" and bridge["ipMasq"] and bridge["isGateway"]
    assert bridge["ipam"]["type"] == "host-local"
    assert bridge["ipam"]["ranges"] == [[{"subnet": node.pod_cidr}]]


def test_containerd_config_round_trips_as_toml() -> None:
    node = _plan(1)[0]
    doc = nodeconfig.containerd_config(
        node, pause_image="localhost/testenv/pause:1", cni_conf_dir=Path("/n/cni"),
        cni_bin_dir="/usr/lib/cni", runc="/usr/sbin/runc", nvidia_runtime="/n/nvidia-runtime",
    )  # fmt: skip
    parsed = tomllib.loads(nodeconfig.to_toml(doc))
    assert parsed == doc
    cri = parsed["plugins"]["io.containerd.cri.v1.runtime"]
    assert cri["restrict_oom_score_adj"] is True  # else runc cannot start the pause container
    assert cri["disable_apparmor"] is True and cri["netns_mounts_under_state_dir"] is True
    assert cri["cdi_spec_dirs"] == ["/var/run/cdi"]
    runc = cri["containerd"]["runtimes"]["runc"]
    assert runc["options"] == {"BinaryName": "/usr/sbin/runc", "SystemdCgroup": False}
    nvidia = cri["containerd"]["runtimes"]["nvidia"]  # RuntimeClass nvidia's handler
    assert nvidia["options"] == {"BinaryName": "/n/nvidia-runtime", "SystemdCgroup": False}
    assert cri["cni"] == {"bin_dirs": ["/usr/lib/cni"], "conf_dir": "/n/cni"}
    images = parsed["plugins"]["io.containerd.cri.v1.images"]
    assert images["pinned_images"] == {"sandbox": "localhost/testenv/pause:1"}
    assert parsed["root"] == str(node.dir / "containerd")


def test_toml_quotes_keys_and_strings() -> None:
    doc = {"a b": {"c.d": 'x"y\\z', "n": 3, "t": True, "l": ["p", "q"]}, "top": "v"}
    assert tomllib.loads(nodeconfig.to_toml(doc)) == doc
    with pytest.raises(TypeError):
        nodeconfig.to_toml({"f": 1.5})


def test_env_file_is_sourced_literally() -> None:
    hostile = "x'; touch /tmp/pwned; echo '$(id) `id` \\ \"q\""
    text = nodeconfig.env_file({"A": hostile, "B": "plain"})
    out = subprocess.run(
        ["bash", "-c", 'source /dev/stdin; printf "%s\\n%s" "$A" "$B"'],
        input=text, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert out.stdout == f"{hostile}\nplain"
    with pytest.raises(NodeConfigError):
        nodeconfig.env_file({"bad-name": "x"})


def test_init_env_routes_to_the_other_nodes_pods_only() -> None:
    planned = _plan(3)
    env = nodeconfig.init_env(
        planned[1], nodeconfig.network_for_slot(7), peers=planned, k8s_bin=Path("/k"),
        node_bin=Path("/n/bin"), images=[Path("/i/pause.oci.tar"), Path("/i/shell.oci.tar")],
    )  # fmt: skip
    assert env["PEER_ROUTES"].split() == ["10.244.0.0/24@10.213.7.10", "10.244.2.0/24@10.213.7.12"]
    assert env["NODE_IP"] == "10.213.7.11" and env["NODE_PREFIX_LEN"] == "24"
    assert env["IMAGES"] == "/i/pause.oci.tar /i/shell.oci.tar"
    assert env["SERVICE_CIDR"] == nodeconfig.SERVICE_CIDR


MOUNTS = """\
tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0
cgroup /sys/fs/cgroup/systemd cgroup rw,relatime,name=systemd 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
proc /proc proc rw 0 0
"""
SELF_CGROUP = """\
9:name=systemd:/
4:memory:/jobs/42
1:cpu:/
0::/
"""


def test_cluster_cgroups_nest_under_the_harness_own_cgroup() -> None:
    cid = nodeconfig.cluster_id(STATE)
    assert nodeconfig.cluster_cgroups(MOUNTS, SELF_CGROUP, STATE) == sorted(
        [
            f"/sys/fs/cgroup/cpu/gpu-operator-testenv/{cid}",
            f"/sys/fs/cgroup/memory/jobs/42/gpu-operator-testenv/{cid}",
            f"/sys/fs/cgroup/systemd/gpu-operator-testenv/{cid}",
            f"/sys/fs/cgroup/unified/gpu-operator-testenv/{cid}",
        ]
    )
    pure_v2 = "cgroup2 /sys/fs/cgroup cgroup2 rw,nsdelegate 0 0\n"
    assert nodeconfig.cluster_cgroups(pure_v2, "0::/user.slice/x\n", STATE) == [
        f"/sys/fs/cgroup/user.slice/x/gpu-operator-testenv/{cid}"
    ]
    assert nodeconfig.cluster_id(STATE) != nodeconfig.cluster_id(STATE / "other")


def test_cgroup_levels_another_cluster_makes_at_the_same_moment_are_shared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two clusters starting at once both find the shared top level missing; the second
    must take the first's level, CPUs included, rather than fail with File exists."""
    root = tmp_path / "cpuset"
    root.mkdir()
    (root / "cpuset.cpus").write_text("0-1\n")
    (root / "cpuset.mems").write_text("0\n")
    monkeypatch.setattr(realnodes, "HOST_LOCK", tmp_path / "lock")
    real_mkdir = Path.mkdir
    top = root / nodeconfig.CGROUP_TOP

    def kernel_mkdir(self: Path, *args: object, **kwargs: object) -> None:
        if self == top and not self.exists():  # the other cluster wins the race
            real_mkdir(self)
            for knob in ("cpuset.cpus", "cpuset.mems"):
                (self / knob).write_text((root / knob).read_text())
        real_mkdir(self, *args, **kwargs)  # type: ignore[arg-type]
        for knob in ("cpuset.cpus", "cpuset.mems"):  # a new cpuset cgroup starts empty
            if not (self / knob).exists():
                (self / knob).write_text("")

    monkeypatch.setattr(Path, "mkdir", kernel_mkdir)
    node = top / "cluster" / "node-1"
    realnodes._make_cgroup(node)
    for level in (top, top / "cluster", node):
        assert (level / "cpuset.cpus").read_text() == "0-1\n"
        assert (level / "cpuset.mems").read_text() == "0\n"


def test_makefile_installs_the_packages_real_nodes_check_for() -> None:
    makefile = (REPO / "Makefile").read_text()
    match = re.search(r"^NODE_PACKAGES := (.+)$", makefile, re.MULTILINE)
    assert match is not None
    assert tuple(match.group(1).split()) == realnodes.DEBIAN_PACKAGES


def test_build_script_and_module_agree_on_versions(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in binaries._DEFAULT_VERSIONS:
        monkeypatch.delenv(key, raising=False)
    assert binaries.versions() == binaries._DEFAULT_VERSIONS
    assert binaries.node_image_name("shell") == "localhost/testenv/shell:1"
    assert binaries.node_dir().name == "containerd-v2.4.2_images-1"


def test_real_nodes_unavailable_says_why_in_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(realnodes.os, "geteuid", lambda: 1000)
    reason = realnodes.why_unavailable(tmp_path)
    assert reason is not None and "root" in reason and "\n" not in reason
    monkeypatch.setattr(realnodes.os, "geteuid", lambda: 0)
    monkeypatch.setattr(realnodes.shutil, "which", lambda name: None)
    reason = realnodes.why_unavailable(tmp_path)
    assert reason is not None and "\n" not in reason
    assert "make packages" in reason and "runc" in reason
