"""One request of a Kubernetes store on the API server, its failures as the stores' errors (ipam.store.base):
shared by the CRD store (ipam.store.kube), the node slices (ipam.store.nodeslices) and the turns' Leases
(ipam.store.kubeturn).

No answer (Unreachable) is StoreUnavailable, an answer that does not come within the read timeout (Busy)
StoreBusy; an error status (`api_failure`): 409 Conflict, 429 and 504 StoreBusy, a request or an object
too large for the server code 100 (final: the same write fails again), the caller's `unavailable`
statuses and 5xx StoreUnavailable, anything else a rejected request (code 7 for a bad name); 404 is
"absent" (None) unless the caller says otherwise."""

from __future__ import annotations

from collections.abc import Callable

from cni.errors import CniError, Code
from ipam.kubeapi import ApiError, Busy, Client, Unreachable
from ipam.store.base import Conflict, StoreBusy, StoreUnavailable

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing would cost every call
if TYPE_CHECKING:
    from typing import Any

PATCH_TEST_FAILED = "the server rejected our request due to an error in our request"  # 422 of a failed test
# The API server's answers to a write too large for it: etcd's request limit (500), its own client's
# (500: an object over 2 MiB), its own request body limit (413)
TOO_LARGE = ("etcdserver: request is too large", "trying to send message larger than max")


def request(
    client: Client, method: str, path: str, what: str, body: Any = None, query: dict[str, Any] | None = None,
    content_type: str = "", own: Callable[[ApiError], CniError | None] | None = None,
    unavailable: tuple[int, ...] = (401, 403, 410),
) -> dict[str, Any] | None:  # fmt: skip
    """One request (`what` names it in errors); None for 404. `own`: the caller's error for an error
    status, where it has one (else `api_failure`)."""
    try:
        return client.request(method, path, body, query, content_type)
    except Busy as e:  # a write may have been applied: retrying is safe (guarded patches, CAS)
        raise StoreBusy(f"kubernetes: {what}: {e}") from None
    except Unreachable as e:
        raise StoreUnavailable(f"kubernetes: {what}: {e}") from None
    except ApiError as e:
        if e.status == 404:
            return None
        mine = own(e) if own is not None else None
        raise (mine if mine is not None else api_failure(e, what, unavailable)) from None


def api_failure(e: ApiError, what: str, unavailable: tuple[int, ...] = (401, 403)) -> CniError:
    """The error an API error status (not 404) stands for (module docstring)."""
    if e.status == 409:
        return Conflict(f"kubernetes: {what}: {e.message or e.reason}")
    if e.status == 413 or (e.status == 500 and any(t in e.message for t in TOO_LARGE)):
        msg, why = f"kubernetes: {what}: too large for the API server: {e}", "docs/ipam.md#pool-size-limit"
        return CniError(msg, why, code=Code.POOL_EXHAUSTED)
    if e.status in (429, 504):
        return StoreBusy(f"kubernetes: {what}: {e}")
    if e.status in unavailable or e.status >= 500:
        return StoreUnavailable(f"kubernetes: {what}: {e}")
    code = Code.INVALID_CONFIG if "metadata.name" in e.message else Code.INTERNAL
    return CniError(f"kubernetes: {what} rejected: {e}", code=code)
