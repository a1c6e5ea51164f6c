"""The ValidatingAdmissionPolicies that refuse a bad GPU claim config at ``kubectl apply``.

NVIDIA's DRA driver checks its opaque configs (``GpuConfig``, ``MigDeviceConfig`` and, with
PassthroughSupport, ``VfioDeviceConfig``) in a
webhook; here the API server checks them itself, with CEL, so there is no server to run, no
certificate to rotate and nothing to fail open. One policy for ResourceClaims, one for
ResourceClaimTemplates, each with the rules of :mod:`gpu_operator.api.draconfig` that need only
the object: the kinds, unknown fields, the strategy and its gate, the interval, the thread
percentage, the pinned-memory limits, the other strategy's section. What needs the allocation
(a per-device limit keyed by UUID or index, a config whose kind does not fit the device a
request got) is judged at Prepare, and fails it with the reason in the pod's Events.

The rules are built from the gates the GPUCluster sets: a strategy whose gate is off is
refused. Every CEL string here is made from this module's constants and booleans, never from
a user's text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpu_operator.api import draconfig
from gpu_operator.api.dragates import Gates
from gpu_operator.api.gpucluster import DRIVER_NAME
from gpu_operator.labels import MANAGED_BY, OPERATOR_NAME

POLICY_PREFIX = "gpu.nvidia.com-configs"
MANAGED = {MANAGED_BY: OPERATOR_NAME}
GPU_SHARING_FIELDS = ("strategy", "timeSlicingConfig", "mpsConfig")
MIG_SHARING_FIELDS = ("strategy", "mpsConfig")
IOMMU_FIELDS = ("backendPolicy", "enableAPIDevice")
MPS_FIELDS = (
    "defaultActiveThreadPercentage",
    "defaultPinnedDeviceMemoryLimit",
    "defaultPerDevicePinnedMemoryLimit",
    "multiUser",
)


@dataclass(frozen=True)
class Target:
    """A resource whose objects carry ``devices.config``, and where."""

    resource: str  # the plural the policy matches
    devices: tuple[str, ...]  # the fields from ``object`` down to ``devices``


CLAIMS = Target("resourceclaims", ("spec", "devices"))
TEMPLATES = Target("resourceclaimtemplates", ("spec", "spec", "devices"))


def _list(items: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{i}'" for i in items) + "]"


@dataclass(frozen=True)
class Rule:
    """One check on a config's parameters ``p``: ``condition`` holds for a good one. The
    message names the field under ``opaque.parameters``; for an unknown field, ``unknown`` is
    (the field's path, its map, the CEL list of its known keys), and the first unknown key is
    named."""

    condition: str
    message: str
    unknown: tuple[str, str, str] | None = None


def _keys(path: str, map_: str, known: str) -> Rule:
    return Rule(f"{map_}.all(k, k in {known})", f"{path}: unknown field", (path, map_, known))


def _rules(gates: Gates) -> list[Rule]:
    s, m = "p.sharing", "p.sharing.mpsConfig"
    has_s = f"has({s})"
    strategy = f"({has_s} && has({s}.strategy) ? {s}.strategy : '')"
    sharing_known = (
        f"(p.kind == '{draconfig.MIG_CONFIG}' ? {_list(MIG_SHARING_FIELDS)} "
        f": {_list(GPU_SHARING_FIELDS)})"
    )
    mps = f"{has_s} && has({m})"
    slicing = f"{has_s} && has({s}.timeSlicingConfig)"
    limit = "isQuantity(string({v})) && quantity(string({v})).compareTo(quantity('1Mi')) >= 0"

    def when(guard: str, rule: Rule) -> Rule:
        return Rule(f"!({guard}) || ({rule.condition})", rule.message, rule.unknown)

    passthrough = gates.on(draconfig.PASSTHROUGH)
    kinds: tuple[str, ...] = (draconfig.GPU_CONFIG, draconfig.MIG_CONFIG)
    kinds_said = f"{draconfig.GPU_CONFIG} or {draconfig.MIG_CONFIG}"
    top_known = _list(("apiVersion", "kind", "sharing"))
    if passthrough:
        kinds += (draconfig.VFIO_CONFIG,)
        kinds_said = f"{draconfig.GPU_CONFIG}, {draconfig.MIG_CONFIG} or {draconfig.VFIO_CONFIG}"
        top_known = (
            f"(has(p.kind) && p.kind == '{draconfig.VFIO_CONFIG}' ? "
            f"{_list(('apiVersion', 'kind', 'iommu'))} : {top_known})"
        )
    rules = [
        Rule(
            f"has(p.apiVersion) && p.apiVersion == '{draconfig.GROUP_VERSION}' && has(p.kind) "
            f"&& p.kind in {_list(kinds)}",
            f": apiVersion {draconfig.GROUP_VERSION} with kind {kinds_said} expected",
        ),
        _keys("", "p", top_known),
        when(has_s, _keys(".sharing", s, sharing_known)),
        when(
            has_s,
            Rule(
                f"{strategy} in {_list((draconfig.TIME_SLICING, draconfig.MPS))}",
                ".sharing.strategy: must be TimeSlicing or MPS",
            ),
        ),
        Rule(
            f"!({strategy} == '{draconfig.MPS}' && has({s}.timeSlicingConfig))",
            ".sharing.timeSlicingConfig cannot be set with strategy MPS: remove it",
        ),
        Rule(
            f"!({strategy} == '{draconfig.TIME_SLICING}' && has({s}.mpsConfig))",
            ".sharing.mpsConfig cannot be set with strategy TimeSlicing: remove it",
        ),
        when(
            slicing, _keys(".sharing.timeSlicingConfig", f"{s}.timeSlicingConfig", "['interval']")
        ),
        when(
            f"{slicing} && has({s}.timeSlicingConfig.interval)",
            Rule(
                f"{s}.timeSlicingConfig.interval in {_list(draconfig.INTERVALS)}",
                ".sharing.timeSlicingConfig.interval: must be one of "
                + ", ".join(draconfig.INTERVALS),
            ),
        ),
        when(mps, _keys(".sharing.mpsConfig", m, _list(MPS_FIELDS))),
        when(
            f"{mps} && has({m}.defaultActiveThreadPercentage)",
            Rule(
                f"type({m}.defaultActiveThreadPercentage) == int && "
                f"{m}.defaultActiveThreadPercentage >= 0 && "
                f"{m}.defaultActiveThreadPercentage <= 100",
                ".sharing.mpsConfig.defaultActiveThreadPercentage: must be a whole number from 0 "
                "to 100",
            ),
        ),
        when(
            f"{mps} && has({m}.defaultPinnedDeviceMemoryLimit)",
            Rule(
                limit.format(v=f"{m}.defaultPinnedDeviceMemoryLimit"),
                ".sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: must be a quantity of at "
                "least 1Mi (such as 512Mi or 10Gi)",
            ),
        ),
        when(
            f"{mps} && has({m}.defaultPerDevicePinnedMemoryLimit)",
            Rule(
                f"{m}.defaultPerDevicePinnedMemoryLimit.all(d, "
                + limit.format(v=f"{m}.defaultPerDevicePinnedMemoryLimit[d]")
                + ")",
                ".sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit: each limit must be a "
                "quantity of at least 1Mi",
            ),
        ),
        when(
            f"{mps} && has({m}.multiUser)",
            Rule(
                f"type({m}.multiUser) == bool",
                ".sharing.mpsConfig.multiUser: must be true or false",
            ),
        ),
    ]
    if passthrough:
        rules += _iommu_rules()
    # The gates first: a strategy that cannot be used at all is what to say first.
    gated = [
        Rule(
            f"{strategy} != '{strategy_name}'",
            f".sharing.strategy: {strategy_name} needs the DRA driver's feature gate {gate} "
            f"(GPUCluster spec.draDriver.featureGates.{gate}: true)",
        )
        for strategy_name, gate in draconfig.GATE_OF.items()
        if not gates.on(gate)
    ]
    return gated + rules


def _iommu_rules() -> list[Rule]:
    """``VfioDeviceConfig.iommu`` (PassthroughSupport): its fields, the policy required and one
    of NVIDIA's, the API device a boolean."""
    i = "p.iommu"
    policies = (draconfig.LEGACY_ONLY, draconfig.PREFER_IOMMUFD)
    guard = f"!has({i})"
    return [
        Rule(
            f"{guard} || {i}.all(k, k in {_list(IOMMU_FIELDS)})",
            ".iommu: unknown field",
            (".iommu", i, _list(IOMMU_FIELDS)),
        ),
        Rule(
            f"{guard} || (has({i}.backendPolicy) && {i}.backendPolicy in {_list(policies)})",
            ".iommu.backendPolicy: must be " + " or ".join(policies),
        ),
        Rule(
            f"{guard} || !has({i}.enableAPIDevice) || type({i}.enableAPIDevice) == bool",
            ".iommu.enableAPIDevice: must be true or false",
        ),
    ]


def _policy(target: Target, gates: Gates) -> dict[str, Any]:
    devices = "object." + ".".join(target.devices)
    guards = [
        f"has(object.{'.'.join(target.devices[: i + 1])})" for i in range(1, len(target.devices))
    ]
    configs = " && ".join([*guards, f"has({devices}.config)"]) + f" ? {devices}.config : []"
    params = (
        "variables.configs.filter(c, has(c.opaque) && c.opaque.driver == "
        f"'{DRIVER_NAME}' && has(c.opaque.parameters)).map(c, c.opaque.parameters)"
    )
    prefix = ".".join(target.devices) + ".config[].opaque.parameters"
    validations = []
    for rule in _rules(gates):
        entry: dict[str, Any] = {
            "expression": f"variables.params.all(p, {rule.condition})",
            "message": prefix + rule.message,
            "reason": "Invalid",
        }
        if rule.unknown is not None:
            path, map_, known = rule.unknown
            first = f"{map_}.filter(k, !(k in {known}))[0]"
            entry["messageExpression"] = (
                f"'{prefix}{path}.' + variables.params.filter(p, !({rule.condition}))"
                f".map(p, {first})[0] + ': unknown field'"
            )
        validations.append(entry)
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": f"{POLICY_PREFIX}-{target.resource}", "labels": dict(MANAGED)},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": ["resource.k8s.io"],
                        "apiVersions": ["*"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": [target.resource],
                    }
                ]
            },
            "variables": [
                {"name": "configs", "expression": configs},
                {"name": "params", "expression": params},
            ],
            "validations": validations,
        },
    }


def _binding(policy: dict[str, Any]) -> dict[str, Any]:
    name = policy["metadata"]["name"]
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name, "labels": dict(MANAGED)},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    }


def config_policies(gates: Gates) -> list[dict[str, Any]]:
    """The policies and their bindings, policies first (a binding to a missing policy is
    ignored by the API server, but reads as a mistake)."""
    policies = [_policy(t, gates) for t in (CLAIMS, TEMPLATES)]
    return [*policies, *(_binding(p) for p in policies)]
