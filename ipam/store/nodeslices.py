"""Upstream whereabouts' `NodeSlicePool` (whereabouts.cni.cncf.io/v1alpha1, namespaced): the object and
its API access, for ipam.nodeslice.

Object (shared/upstream/whereabouts-crds/whereabouts.cni.cncf.io_nodeslicepools.yaml): named after the
network (`network_name`, else the CNI config's `name`), in the IPAM's namespace; `spec.range` (the
first range's canonical CIDR), `spec.sliceSize` (the config's `node_slice_size` text as written: the
node-slice-controller compares both as strings and re-slices every node when they differ);
`status.allocations[]` = `{nodeName, sliceRange}` for every slice, "" for a free one. The CRD has no
status subresource: status is written with the object (POST, PUT). Writes are compare-and-swap on
resourceVersion (PUT carries the version read; 409 -> Conflict), and a PUT sends back the object as
read with only the allocations changed, so the controller's owner references and anything else stay.

Errors as in ipam.store.kubecall (`api_failure`; 404 is "absent"); every request is checked against
ipam.rbac first."""

from __future__ import annotations

import copy

from ipam import kubeapi, rbac
from ipam.kubeapi import ApiError, Client, Unreachable
from ipam.store.base import StoreUnavailable
from ipam.store.crd import API_VERSION, GROUP
from ipam.store.kubecall import api_failure

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing would cost every call
if TYPE_CHECKING:
    from typing import Any

RESOURCE = "nodeslicepools"


def new_object(name: str, namespace: str, range_cidr: str, size: str, slices: list[str]) -> dict[str, Any]:
    """A NodeSlicePool with every slice free."""
    return {
        "apiVersion": API_VERSION, "kind": "NodeSlicePool",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"range": range_cidr, "sliceSize": size},
        "status": {"allocations": [{"nodeName": "", "sliceRange": s} for s in slices]},
    }  # fmt: skip


def allocations(obj: dict[str, Any]) -> list[tuple[str, str]]:
    """(nodeName, sliceRange) of every slice, in the object's order; tolerant of a mangled object."""
    status = obj.get("status") if isinstance(obj.get("status"), dict) else {}
    out = []
    for entry in (status or {}).get("allocations") or []:
        if isinstance(entry, dict):
            out.append((str(entry.get("nodeName") or ""), str(entry.get("sliceRange") or "")))
    return out


def spec(obj: dict[str, Any]) -> tuple[str, str]:
    """(spec.range, spec.sliceSize)."""
    s = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
    return str((s or {}).get("range") or ""), str((s or {}).get("sliceSize") or "")


def assigned(obj: dict[str, Any], index: int, node: str) -> dict[str, Any]:
    """A copy of `obj` with slice `index` given to `node` (everything else as read)."""
    out = copy.deepcopy(obj)
    entry = out["status"]["allocations"][index]
    entry["nodeName"] = node
    return out


class NodeSlicePools:
    """NodeSlicePool requests of one client in one namespace, as `role` (ipam.rbac)."""

    def __init__(self, client: Client, namespace: str, role: str | None = None) -> None:
        self.client, self.namespace = client, namespace
        self.role = role or rbac.acting()

    def _call(self, verb: str, name: str, body: Any = None) -> dict[str, Any] | None:
        rbac.require(self.role, GROUP, RESOURCE, verb)
        method = {"get": "GET", "create": "POST", "update": "PUT"}[verb]
        path = kubeapi.path_of(GROUP, "v1alpha1", self.namespace, RESOURCE, "" if verb == "create" else name)
        what = f"{verb} {RESOURCE}/{name}"
        try:
            return self.client.request(method, path, body)
        except Unreachable as e:
            raise StoreUnavailable(f"kubernetes: {what}: {e}") from None
        except ApiError as e:
            if e.status == 404:
                if verb == "get":
                    return None
                raise StoreUnavailable(
                    f"kubernetes: {what}: not served (is the NodeSlicePool CRD installed?)"
                ) from None
            raise api_failure(e, what) from None

    def get(self, name: str) -> dict[str, Any] | None:
        return self._call("get", name)

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Conflict when it exists."""
        return self._call("create", str(obj["metadata"]["name"]), obj) or {}

    def update(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Conflict unless the stored resourceVersion is still obj's."""
        return self._call("update", str(obj["metadata"]["name"]), obj) or {}
