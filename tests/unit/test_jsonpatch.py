"""Patches of what the API shares (node maps and taints, statuses)."""

from __future__ import annotations

from gpu_operator.jsonpatch import merge_patch_to


def test_a_merge_patch_to_a_status_takes_gone_keys_away_at_every_depth() -> None:
    current = {
        "state": "ready",
        "upgrade": {"rollout": {"phase": "held", "failure": {"node": "a"}}},
    }
    new = {"state": "ready", "upgrade": {"rollout": {"phase": "canary"}}}
    patch = merge_patch_to(current, new)
    assert patch == {"state": "ready", "upgrade": {"rollout": {"phase": "canary", "failure": None}}}
