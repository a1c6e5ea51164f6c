"""How `make test` shares tests among pytest-xdist workers (tests/conftest.py)."""

from __future__ import annotations

from gpu_operator.testenv.binaries import versions
from gpu_operator.testenv.releases import OLDEST
from tests.conftest import (
    DRIVER_REAL_CLUSTER,
    OWN_REAL_CLUSTERS,
    REAL_NODES,
    REAL_NODES_DRIVER,
    REAL_NODES_OWN,
    SOLO_REAL_CLUSTERS,
    hand_out_order,
    xdist_group,
)
from tests.paths import REPO

E2E = REPO / "tests" / "e2e"


def test_real_node_modules_split_by_whose_cluster_they_use() -> None:
    assert xdist_group("tests/e2e/test_real_stack.py::test_x") == REAL_NODES
    assert xdist_group("tests/e2e/test_real_driver.py::test_x") == REAL_NODES_DRIVER
    assert xdist_group("tests/e2e/test_real_demo.py::test_x") == REAL_NODES_OWN
    assert xdist_group("tests/e2e/test_upgrade.py::test_x") == "tests/e2e/test_upgrade.py"
    # A module's tests on the oldest release: a unit apart, so both releases run side by side
    default = versions()["K8S_VERSION"]
    assert xdist_group(f"tests/e2e/test_upgrade.py::test_x[{default}]") == (
        "tests/e2e/test_upgrade.py"
    )
    assert xdist_group(f"tests/e2e/test_upgrade.py::test_x[{OLDEST}]") == (
        f"tests/e2e/test_upgrade.py@{OLDEST}"
    )
    for name in SOLO_REAL_CLUSTERS:  # a group of its own
        assert xdist_group(f"tests/e2e/{name}::test_x") == f"tests/e2e/{name}"


def test_the_modules_grouped_apart_really_start_their_own_clusters() -> None:
    """A module in the second group must not use the session's real-node cluster: that one
    lives on the first group's worker, and a second would start beside it."""
    for name in OWN_REAL_CLUSTERS | SOLO_REAL_CLUSTERS:
        text = (E2E / name).read_text()
        assert "real_cluster" not in text, name
    shared = {p.name for p in E2E.glob("test_real_*.py") if "real_cluster" in p.read_text()}
    assert shared and not shared & (OWN_REAL_CLUSTERS | SOLO_REAL_CLUSTERS)
    assert shared > DRIVER_REAL_CLUSTER, "the driver group's modules exist and share a cluster"


def test_long_groups_go_first_and_unit_modules_last_in_the_seeds_order() -> None:
    given = [
        "tests/unit/test_b.py",
        "tests/e2e/test_z.py",
        "tests/unit/test_fuzz_policies.py",
        "tests/unit/test_a.py",
        "tests/chaos/test_chaos.py",
        "tests/e2e/test_y.py",
        REAL_NODES,
    ]
    assert hand_out_order(given) == [
        REAL_NODES,
        "tests/chaos/test_chaos.py",
        "tests/unit/test_fuzz_policies.py",
        "tests/e2e/test_z.py",
        "tests/e2e/test_y.py",
        "tests/unit/test_b.py",
        "tests/unit/test_a.py",
    ]
