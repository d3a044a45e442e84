"""The `kubernetes` pod source of the reconciler (ipam.podsource): one GET per pod (and per IPAMClaim)
asked about, through the store's kubeconfig and the same client (ipam.kubeapi). A 404 is "gone";
anything that is not an answer (no connection, timeout, 401/403, 5xx) is PodSourceError, so the
reconciler frees nothing for that pod. Pods being deleted (deletionTimestamp set) still exist: their
addresses are kept until the pod object is gone."""

from __future__ import annotations

from cni.errors import TryAgainError
from ipam import kubeapi, rbac
from ipam.config import StoreConfig
from ipam.kubeapi import ApiError, Client, Unreachable
from ipam.podsource import PodInfo, PodSourceError


class KubePodSource:
    def __init__(self, client: Client, role: str | None = None) -> None:
        self.client = client
        self.role = role or rbac.acting()

    def lookup(self, namespace: str, name: str) -> PodInfo | None:
        rbac.require(self.role, "", "pods", "get")
        path = kubeapi.path_of("", "v1", namespace, "pods", name)
        try:
            pod = self.client.request("GET", path)
        except ApiError as e:
            if e.status == 404:
                return None
            raise PodSourceError(f"kubernetes: get pod {namespace}/{name}: {e}") from None
        except Unreachable as e:
            raise PodSourceError(f"kubernetes: get pod {namespace}/{name}: {e}") from None
        meta = pod.get("metadata") or {}
        return PodInfo(
            str(meta.get("namespace") or namespace), str(meta.get("name") or name), str(meta.get("uid") or "")
        )

    def claim_uid(self, namespace: str, name: str) -> str | None:
        """An IPAMClaim's UID (ipam.podsource.ClaimSource): one GET; a 404 is "gone", a server that does
        not serve IPAMClaims (no CRD) or any other failure is PodSourceError (nothing freed)."""
        from ipam import claims

        try:
            claim = claims.get_claim(self.client, self.role, namespace, name)
        except TryAgainError as e:
            raise PodSourceError(f"kubernetes: {e}") from None
        return None if claim is None else claim.ref.uid

    def close(self) -> None:
        self.client.close()


def open_pod_source(store: StoreConfig) -> KubePodSource:
    if not store.kubernetes.kubeconfig:
        from cni.errors import ConfigError

        raise ConfigError("--pods kubernetes: needs kubernetes.kubeconfig in the configuration")
    return KubePodSource(kubeapi.open_client(store.kubernetes.kubeconfig))
