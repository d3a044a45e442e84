"""Golden CRD objects: what ipam.store.crd writes is valid against the whereabouts CRD schemas (the
bundled copies, byte-identical to upstream's: tests/unit/test_manifests.py; and the upstream files
themselves when shared/ is beside the clone), and nothing of it would be pruned by an API server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from ipam.model import Allocation, Pool, Reservation
from ipam.store import crd
from tests.kubeapi.emulator import CRDS, validate
from tests.nsutil import REPO

UPSTREAM = REPO.parent / "shared" / "upstream" / "whereabouts-crds"
A = Allocation("a" * 64, "ns/a", "net1", "5a1c1b9e-6c42-4b4e-9a52-0d1c3b6d7a11", "rdma-a", "node-1")
B = Allocation("b" * 64, "ns/b", "net2")

GOLDEN: list[tuple[str, dict[str, Any]]] = [
    ("IPPool", crd.pool_to_object(Pool("198.51.100.0-24", "198.51.100.0/24"), "pycni-system")),
    ("IPPool", crd.pool_to_object(Pool("198.51.100.0-24", "198.51.100.0/24", {"1": A, "254": B}, "7"), "ns")),
    ("IPPool", crd.pool_to_object(
        Pool("rdma-2001-db8---64", "2001:db8::/64", {"1": A, str(2**63 + 5): B, str(2**64 - 2): A}), "ns")),
    ("OverlappingRangeIPReservation", crd.reservation_to_object(Reservation("198.51.100.1", B), "ns")),
    ("OverlappingRangeIPReservation",
     crd.reservation_to_object(Reservation("rdma-2001-db8--1", A, "9"), "ns")),
]  # fmt: skip


def schemas(directory: Path) -> dict[str, dict[str, Any]]:
    out = {}
    for path in directory.glob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "CustomResourceDefinition":
                (version,) = [v for v in doc["spec"]["versions"] if v["name"] == "v1alpha1"]
                out[doc["spec"]["names"]["kind"]] = version["schema"]["openAPIV3Schema"]
    return out


def directories() -> list[Path]:
    return [CRDS, *([UPSTREAM] if UPSTREAM.is_dir() else [])]


@pytest.mark.parametrize("directory", directories(), ids=lambda p: p.parent.name)
@pytest.mark.parametrize(("kind", "obj"), GOLDEN, ids=[f"{k}-{i}" for i, (k, _) in enumerate(GOLDEN)])
def test_golden_objects_are_valid_and_survive_pruning(
    directory: Path, kind: str, obj: dict[str, Any]
) -> None:
    schema = schemas(directory)[kind]
    assert obj["kind"] == kind and obj["apiVersion"] == "whereabouts.cni.cncf.io/v1alpha1"
    jsonschema.validate(obj, schema)
    body = {k: v for k, v in obj.items() if k != "metadata"}
    assert validate(body, schema, "") == body  # no unknown field the API server would drop
    assert all(isinstance(k, str) and k.isdigit() for k in (obj.get("spec", {}).get("allocations") or {}))


def test_schema_check_is_not_a_noop() -> None:
    schema = schemas(CRDS)["IPPool"]
    bad = crd.pool_to_object(Pool("x", "198.51.100.0/24", {"1": A}), "ns")
    del bad["spec"]["allocations"]["1"]["id"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)
    extra = crd.pool_to_object(Pool("x", "198.51.100.0/24", {"1": A}), "ns")
    extra["spec"]["allocations"]["1"]["poduid"] = "u"
    body = {k: v for k, v in extra.items() if k != "metadata"}
    assert validate(body, schema, "") != body
