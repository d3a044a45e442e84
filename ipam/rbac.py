"""Every Kubernetes API access of pycni's IPAM, declared once: (API group, resource, verbs, scope) for the
node side (the plugin run by the kubelet, through the kubeconfig the installer writes) and for the
reconciler. bundler/manifests/rbac.yaml grants exactly these and nothing else (tests/unit/test_manifests.py
cross-checks), and the Kubernetes store and pod source call `require()` before each kind of request, so a
new access fails the tests until it is declared here and granted there. No wildcards."""

from __future__ import annotations

from cni.types.valueclass import valueclass

WHEREABOUTS = "whereabouts.cni.cncf.io"
COORDINATION = "coordination.k8s.io"
IPAMCLAIMS = "k8s.cni.cncf.io"  # IPAMClaim (k8snetworkplumbingwg/ipamclaims), the group of the NAD CRD
NODE, RECONCILER = "node", "reconciler"


@valueclass
class Rule:
    group: str  # "" is the core API group
    resource: str
    verbs: tuple[str, ...]
    namespaced: bool  # granted by a Role in the IPAM's namespace, not cluster-wide


RULES: dict[str, tuple[Rule, ...]] = {
    NODE: (
        # read a pool, create it on first use, change its entries with a guarded JSON Patch; list: STATUS
        Rule(WHEREABOUTS, "ippools", ("get", "list", "create", "patch"), namespaced=True),
        # one reservation per address when overlapping ranges are on; update: kubelet re-ADD takes it
        # over; list: GC
        Rule(WHEREABOUTS, "overlappingrangeipreservations", ("get", "list", "create", "update", "delete"),
             namespaced=True),
        # node slices (ipam.nodeslice): read this network's NodeSlicePool; where no node-slice-controller
        # made it or assigned this node, create it or take a free slice (compare-and-swap: update)
        Rule(WHEREABOUTS, "nodeslicepools", ("get", "create", "update"), namespaced=True),
        # the write turn of a pool several nodes write (ipam.turn, ipam.store.kubeturn): the turn (get,
        # create, patch: take and release; watch: wait for it), each waiting writer's intent (create,
        # delete; list: the holder's round)
        Rule(COORDINATION, "leases", ("get", "list", "watch", "create", "patch", "delete"), namespaced=True),
        # the agent's pod watch (ipam.podwatch): list and watch the pods of its node (fieldSelector
        # spec.nodeName; RBAC cannot hold it to that: docs/kubernetes-objects.md), GET a deleted pod's
        # name when an entry has no UID or another one. Its sweeps free with the verbs above.
        Rule("", "pods", ("get", "list", "watch"), namespaced=False),
        # persistent addresses (ipam.claims, allowPersistentIPs): GET the IPAMClaim an attachment names
        # (in its pod's namespace) and write its status once it has its addresses; the agent's claim
        # watch (ipam.claimwatch) lists and watches them while its node holds claims
        Rule(IPAMCLAIMS, "ipamclaims", ("get", "list", "watch"), namespaced=False),
        Rule(IPAMCLAIMS, "ipamclaims/status", ("patch",), namespaced=False),
    ),
    RECONCILER: (
        # the reconciler and the operator CLI (pools, show, release): page through pools, free entries
        Rule(WHEREABOUTS, "ippools", ("get", "list", "patch"), namespaced=True),
        Rule(WHEREABOUTS, "overlappingrangeipreservations", ("get", "list", "delete"), namespaced=True),
        # one GET per pod asked about (ipam.kubepods): no pod list, no watch
        Rule("", "pods", ("get",), namespaced=False),
        # one GET per IPAMClaim that owns an entry (ipam.claimref): freed once the claim is gone
        Rule(IPAMCLAIMS, "ipamclaims", ("get",), namespaced=False),
    ),
}


class NotGranted(RuntimeError):
    """The code tried an API access that ipam.rbac does not declare (and so the manifests do not grant)."""


_acting = NODE


def act_as(role: str) -> None:
    """Which role this process acts as (the operator CLI and reconciler: RECONCILER); clients opened
    afterwards check their requests against it."""
    global _acting
    if role not in RULES:
        raise ValueError(f"unknown role {role!r}")
    _acting = role


def acting() -> str:
    return _acting


def require(role: str, group: str, resource: str, verb: str) -> None:
    """Raise NotGranted unless `role` declares `verb` on `group/resource`."""
    for rule in RULES[role]:
        if rule.group == group and rule.resource == resource and verb in rule.verbs:
            return
    raise NotGranted(f"{role}: {verb} {group or 'core'}/{resource} is not declared in ipam/rbac.py")
