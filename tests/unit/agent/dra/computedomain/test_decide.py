"""The compute-domain plugin's decisions: its pool, a claim's configs, each attempt at a channel,
a daemon's edits, the node's labels and the CDI specs."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_operator.agent.dra import slices
from gpu_operator.agent.dra.computedomain import decide
from gpu_operator.agent.dra.computedomain.decide import (
    Asked,
    ChannelConfig,
    ChannelSeen,
    CharDevice,
    DaemonConfig,
    Label,
    PreparedDomainDevice,
    Ready,
    Refuse,
    Refused,
    Wait,
)
from gpu_operator.agent.driver_cdi import HostDriver
from gpu_operator.agent.driverroot import DeviceNodes
from gpu_operator.api.computedomain import API_VERSION, parse_computedomain

NODE = "node-a"
UID = "0f1e2d3c-aaaa-bbbb-cccc-000000000001"
CLIQUE = "1b2c3d4e-0000-0000-0000-000000000007.3"
DRIVER = "compute-domain.nvidia.com"


def domain_doc(
    uid: str = UID, namespace: str = "team", nodes: list[dict[str, Any]] | None = None, **meta: Any
) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": "ComputeDomain",
        "metadata": {"name": "imex", "namespace": namespace, "uid": uid, **meta},
        "spec": {"channel": {"resourceClaimTemplate": {"name": "imex-channel"}}},
    }
    if nodes is not None:
        doc["status"] = {"nodes": nodes}
    return doc


def params(kind: str = "ComputeDomainChannelConfig", **extra: Any) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": kind, "domainID": UID, **extra}


def claim(
    *results: tuple[str, str],
    configs: list[dict[str, Any]] | None = None,
    uid: str = "claim-1",
    pool: str = NODE,
) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "team", "name": "c", "uid": uid},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": r, "driver": DRIVER, "pool": pool, "device": d}
                        for r, d in results
                    ],
                    "config": configs or [],
                }
            }
        },
    }


def opaque(p: dict[str, Any], *requests: str, source: str = "FromClaim") -> dict[str, Any]:
    return {
        "source": source,
        "requests": list(requests),
        "opaque": {"driver": DRIVER, "parameters": p},
    }


# -- the pool ---------------------------------------------------------------------------------
def test_the_pool_is_nvidias_channel_0_and_daemon_0_in_one_slice() -> None:
    devices = decide.pool_devices()
    assert devices == [
        {"name": "channel-0", "attributes": {"type": {"string": "channel"}, "id": {"int": 0}}},
        {"name": "daemon-0", "attributes": {"type": {"string": "daemon"}, "id": {"int": 0}}},
    ]
    plan = slices.plan(NODE, [], devices, {"name": NODE, "uid": "u"}, driver=DRIVER)
    (one,) = plan.apply
    assert one["metadata"]["name"] == f"{NODE}-{DRIVER}-0"
    assert one["spec"]["driver"] == DRIVER
    assert one["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
    assert slices.field_selector(NODE, DRIVER) == f"spec.nodeName={NODE},spec.driver={DRIVER}"
    assert slices.plan(NODE, list(plan.apply), devices, driver=DRIVER).writes == 0


def test_the_channel_count_is_nvidias() -> None:
    assert decide.MAX_CHANNELS == 2048


# -- configs ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("", "cannot be empty"),
        (None, "cannot be empty"),
        ("..", "single path segment"),
        ("../../etc", "single path segment"),
        ("a/b", "single path segment"),
        ("x" * 64, "label value"),
        ("-leading", "label value"),
        (UID, None),
    ],
)
def test_a_domain_id_names_one_directory_and_is_a_label_value(
    value: object, problem: str | None
) -> None:
    found = decide.domain_id_problem(value)
    assert (found is None) if problem is None else (problem in (found or ""))


def test_configs_are_decoded_strictly() -> None:
    assert decide.parse_config(params(), "c") == ChannelConfig(UID, "Single")
    assert decide.parse_config(params(allocationMode="All"), "c") == ChannelConfig(UID, "All")
    assert decide.parse_config(params("ComputeDomainDaemonConfig"), "c") == DaemonConfig(UID)
    with pytest.raises(Refused, match=r"unknown field.*numNodes"):
        decide.parse_config(params(numNodes=2), "c")
    with pytest.raises(Refused, match=r"unknown field.*allocationMode"):
        decide.parse_config(params("ComputeDomainDaemonConfig", allocationMode="All"), "c")
    with pytest.raises(Refused, match="allocationMode must be Single or All"):
        decide.parse_config(params(allocationMode="Some"), "c")
    with pytest.raises(Refused, match="apiVersion must be resource"):
        decide.parse_config({**params(), "apiVersion": "v1"}, "c")
    with pytest.raises(Refused, match="kind must be"):
        decide.parse_config(params("GpuConfig"), "c")


def test_each_result_takes_its_config_claims_over_classes() -> None:
    other = "0f1e2d3c-aaaa-bbbb-cccc-000000000002"
    got = decide.asked(
        claim(
            ("channel", "channel-0"),
            ("daemon", "daemon-0"),
            configs=[
                opaque(params(domainID=other), "channel"),  # the claim's: wins
                opaque(params(allocationMode="All"), "channel", source="FromClass"),
                opaque(params("ComputeDomainDaemonConfig")),  # no requests: every daemon
                {"requests": ["channel"], "opaque": {"driver": "gpu.nvidia.com", "parameters": 1}},
            ],
        ),
        "claim-1",
        NODE,
    )
    assert got == (
        Asked("channel", "channel-0", ChannelConfig(other, "Single")),
        Asked("daemon", "daemon-0", DaemonConfig(UID)),
    )


@pytest.mark.parametrize(
    ("kwargs", "said"),
    [
        ({"uid": "other"}, "is not the claim's"),
        ({"pool": "node-b"}, "no allocation of compute-domain.nvidia.com devices on node node-a"),
        ({"device": "channel-1"}, "not one this plugin publishes"),
        ({"configs": []}, "request channel: domainID cannot be empty"),
        (
            {"configs": [opaque(params("ComputeDomainDaemonConfig"), "channel")]},
            "cannot apply to request channel",
        ),
        ({"configs": [opaque(params(domainID="../x"), "channel")]}, "single path segment"),
    ],
)
def test_claims_that_cannot_be_prepared_are_refused(kwargs: dict[str, Any], said: str) -> None:
    device = kwargs.pop("device", "channel-0")
    configs = kwargs.pop("configs", [opaque(params(), "channel")])
    uid = kwargs.pop("uid", "claim-1")
    with pytest.raises(Refused, match=said):
        decide.asked(
            claim(("channel", device), configs=configs, uid="claim-1", **kwargs), uid, NODE
        )


# -- a channel, attempt by attempt ------------------------------------------------------------
def seen(**changes: Any) -> ChannelSeen:
    values: dict[str, Any] = {
        "claim_namespace": "team",
        "domain": parse_computedomain(domain_doc()),
        "daemon_ready": True,
        "node_label": UID,
        "holder": None,
    }
    values.update(changes)
    return ChannelSeen(**values)


SINGLE, ALL = ChannelConfig(UID, "Single"), ChannelConfig(UID, "All")


def test_a_claim_from_another_namespace_is_refused_with_what_to_do() -> None:
    step = decide.decide_channel(SINGLE, seen(claim_namespace="intruder"), NODE, CLIQUE)
    assert isinstance(step, Refuse)
    assert "ComputeDomain team/imex serves claims in namespace team only" in step.reason
    assert "this claim is in intruder" in step.reason
    assert "use the ResourceClaimTemplate the ComputeDomain names" in step.reason


def test_a_missing_or_deleted_domain_is_refused() -> None:
    gone = decide.decide_channel(SINGLE, seen(domain=None), NODE, CLIQUE)
    assert isinstance(gone, Refuse) and "no ComputeDomain has the claim's domainID" in gone.reason
    doc = domain_doc(deletionTimestamp="2026-01-01T00:00:00Z")
    going = decide.decide_channel(SINGLE, seen(domain=parse_computedomain(doc)), NODE, CLIQUE)
    assert isinstance(going, Refuse) and "is being deleted" in going.reason


def test_an_unlabelled_node_is_labelled_first() -> None:
    step = decide.decide_channel(SINGLE, seen(node_label=None, daemon_ready=False), NODE, CLIQUE)
    assert step == Label({"metadata": {"labels": {"resource.nvidia.com/computeDomain": UID}}})


def test_the_claim_waits_for_the_daemon_for_channel_0_and_for_another_domain() -> None:
    starting = decide.decide_channel(SINGLE, seen(daemon_ready=False), NODE, CLIQUE)
    assert isinstance(starting, Wait)
    assert "IMEX daemon of ComputeDomain team/imex on node node-a is not Ready yet" in (
        starting.reason
    )
    held = decide.decide_channel(SINGLE, seen(holder="claim-0"), NODE, CLIQUE)
    assert isinstance(held, Wait) and "held by claim claim-0" in held.reason
    other = decide.decide_channel(SINGLE, seen(node_label="another-uid"), NODE, CLIQUE)
    assert isinstance(other, Wait)
    assert "resource.nvidia.com/computeDomain=another-uid" in other.reason


def test_a_ready_daemon_gives_one_channel_or_all_and_none_without_a_clique() -> None:
    assert decide.decide_channel(SINGLE, seen(), NODE, CLIQUE) == Ready(1)
    assert decide.decide_channel(ALL, seen(), NODE, CLIQUE) == Ready(2048)
    assert decide.decide_channel(ALL, seen(), NODE, None) == Ready(0)


def test_the_daemon_is_ready_from_the_domains_status_nodes() -> None:
    ready = domain_doc(
        nodes=[{"name": "node-b", "status": "NotReady"}, {"name": NODE, "status": "Ready"}]
    )
    assert decide.node_ready(ready, NODE)
    assert not decide.node_ready(ready, "node-b")
    assert not decide.node_ready(domain_doc(), NODE)
    assert not decide.node_ready(domain_doc(nodes=[{"name": "node-c", "status": "Ready"}]), NODE)


def test_a_daemon_waits_for_its_domain() -> None:
    domain = parse_computedomain(domain_doc())
    assert decide.decide_daemon(DaemonConfig(UID), domain) is domain
    waiting = decide.decide_daemon(DaemonConfig(UID), None)
    assert isinstance(waiting, Wait) and UID in waiting.reason


# -- labels -----------------------------------------------------------------------------------
def test_the_domain_label_goes_with_the_last_channel_claim_of_its_domain() -> None:
    key = "resource.nvidia.com/computeDomain"
    off = {"metadata": {"labels": {key: None}}}
    assert decide.domain_unlabel({key: UID, "other": "x"}, UID, held=[]) == off
    assert decide.domain_unlabel({key: UID}, UID, held=[UID]) is None  # another claim of it
    assert decide.domain_unlabel({key: "another"}, UID, held=[]) is None  # not ours to take
    assert decide.domain_unlabel({}, UID, held=[]) is None


def test_the_clique_label_says_the_clique_and_goes_without_one() -> None:
    key = "nvidia.com/gpu.clique"
    assert decide.clique_label({}, CLIQUE) == {"metadata": {"labels": {key: CLIQUE}}}
    assert decide.clique_label({key: "old.1"}, CLIQUE) == {"metadata": {"labels": {key: CLIQUE}}}
    assert decide.clique_label({key: CLIQUE}, CLIQUE) is None
    assert decide.clique_label({key: CLIQUE}, None) == {"metadata": {"labels": {key: None}}}
    assert decide.clique_label({"other": "x"}, None) is None


# -- device nodes and CDI ---------------------------------------------------------------------
PROC_DEVICES = """Character devices:
  1 mem
195 nvidia-frontend
234 nvidia-caps-imex-channels
235 nvidia-caps
236 nvidia-caps-imex-channels-x

Block devices:
  8 sd
240 nvidia-caps
"""


def test_majors_come_from_the_character_devices() -> None:
    assert decide.device_major(PROC_DEVICES, "nvidia-caps-imex-channels") == 234
    assert decide.device_major(PROC_DEVICES, "nvidia-caps") == 235
    assert decide.device_major(PROC_DEVICES, "nvidia-uvm") is None
    assert decide.device_major("Block devices:\n 240 nvidia-caps\n", "nvidia-caps") is None


def test_the_imex_management_capability_is_a_caps_node() -> None:
    text = "DeviceFileMinor: 1\nDeviceFileMode: 256\nDeviceFileModify: 1\n"
    assert decide.capability_device(text, 235) == CharDevice(
        "/dev/nvidia-caps/nvidia-cap1", 235, 1, 256
    )
    with pytest.raises(ValueError, match="DeviceFileMinor"):
        decide.capability_device("nothing\n", 235)


def channel(channels: int) -> PreparedDomainDevice:
    asked = Asked("channel", "channel-0", SINGLE)
    return decide.prepared_channel("claim-1", asked, NODE, channels, 234)


def test_a_single_channel_is_channel0_made_by_the_runtime() -> None:
    p = channel(1)
    assert p.cdi_ids == ("k8s.compute-domain.nvidia.com/claim=claim-1-channel-0",)
    spec = decide.cdi_spec("claim-1", [p], "/var/lib/kubelet/plugins/compute-domain.nvidia.com")
    assert spec == {
        "cdiVersion": "0.6.0",
        "kind": "k8s.compute-domain.nvidia.com/claim",
        "devices": [
            {
                "name": "claim-1-channel-0",
                "containerEdits": {
                    "deviceNodes": [
                        {
                            "path": "/dev/nvidia-caps-imex-channels/channel0",
                            "type": "c",
                            "major": 234,
                            "minor": 0,
                            "fileMode": 0o666,
                        }
                    ]
                },
            }
        ],
    }
    assert decide.spec_file_name("claim-1") == "k8s.compute-domain.nvidia.com-claim_claim-1.json"


def test_all_channels_are_every_channel_and_no_clique_is_none() -> None:
    spec = decide.cdi_spec("claim-1", [channel(2048)], "/p")
    assert spec is not None
    nodes = spec["devices"][0]["containerEdits"]["deviceNodes"]
    assert [n["minor"] for n in nodes] == list(range(2048))
    assert nodes[-1]["path"] == "/dev/nvidia-caps-imex-channels/channel2047"
    nothing = channel(0)
    assert nothing.cdi_ids == ()  # the kubelet is given the device, with nothing to inject
    assert decide.cdi_spec("claim-1", [nothing], "/p") is None


def no_driver() -> HostDriver:
    return HostDriver(
        None, DeviceNodes("/", {0: "/dev/nvidia0"}, ("/dev/nvidiactl",), ()), "/", "/"
    )


def test_a_daemon_gets_its_domain_directory_identity_driver_and_imex_management() -> None:
    domain = parse_computedomain(domain_doc())
    mgmt = CharDevice("/dev/nvidia-caps/nvidia-cap1", 235, 1, 256)
    asked = Asked("daemon", "daemon-0", DaemonConfig(UID))
    p = decide.prepared_daemon("claim-9", asked, NODE, domain, CLIQUE, mgmt)
    spec = decide.cdi_spec(
        "claim-9", [p], "/var/lib/kubelet/plugins/compute-domain.nvidia.com", no_driver()
    )
    assert spec is not None
    (device,) = spec["devices"]
    assert device["name"] == "claim-9-daemon-0"
    edits = device["containerEdits"]
    assert edits["env"] == [
        f"CLIQUE_ID={CLIQUE}",
        f"COMPUTE_DOMAIN_UUID={UID}",
        "COMPUTE_DOMAIN_NAME=imex",
        "COMPUTE_DOMAIN_NAMESPACE=team",
    ]
    assert edits["mounts"] == [
        {
            "hostPath": f"/var/lib/kubelet/plugins/compute-domain.nvidia.com/domains/{UID}",
            "containerPath": "/imexd",
            "options": ["rw", "nosuid", "nodev", "bind"],
        }
    ]
    assert edits["deviceNodes"] == [mgmt.to_cdi()]
    common = spec["containerEdits"]  # the driver, and the GPUs: NVIDIA's device=all
    assert common["env"] == ["NVIDIA_VISIBLE_DEVICES=void"]
    assert {"path": "/dev/nvidia0"} in common["deviceNodes"]
    assert {"path": "/dev/nvidiactl"} in common["deviceNodes"]


def test_a_daemon_without_a_clique_has_an_empty_clique_id_and_no_imex_node() -> None:
    domain = parse_computedomain(domain_doc())
    asked = Asked("daemon", "daemon-0", DaemonConfig(UID))
    p = decide.prepared_daemon("claim-9", asked, NODE, domain, None, None)
    edits = decide.device_edits(p, "/p")
    assert edits is not None
    assert edits["env"][0] == "CLIQUE_ID="
    assert "deviceNodes" not in edits


def test_prepared_devices_survive_the_checkpoint() -> None:
    domain = parse_computedomain(domain_doc())
    mgmt = CharDevice("/dev/nvidia-caps/nvidia-cap1", 235, 1, 256)
    daemon = decide.prepared_daemon(
        "c", Asked("daemon", "daemon-0", DaemonConfig(UID)), NODE, domain, CLIQUE, mgmt
    )
    for p in (channel(2048), channel(0), daemon):
        assert PreparedDomainDevice.from_json(p.to_json()) == p


def test_stale_domain_directories_are_those_of_gone_unheld_domains() -> None:
    assert decide.stale_domains(["a", "b", "c"], live=["a"], held=["b"]) == ["c"]
