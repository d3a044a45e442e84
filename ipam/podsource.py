"""Where the reconciler learns whether a pod exists. The interface asks about ONE pod at a time, so a
source can answer from a GET, a watch cache or a file without the reconciler ever holding a pod list;
the reconciler keeps a bounded LRU of answers per run.

A source must answer "this pod does not exist" only when it knows; when it cannot tell (API down,
forbidden), it raises PodSourceError and the reconciler frees nothing for that pod.

Sources: `file:PATH` (JSON list or JSON lines of {"namespace", "name", "uid"}: for tests, drills and
nodes without Kubernetes) here; `kubernetes` in ipam.kubepods (written with the Kubernetes store), which
also answers for IPAMClaims (`ClaimSource`); the CLI chooses (ipam.cli `--pods`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from cni import jsonio
from cni.errors import ConfigError, TryAgainError


@dataclass(frozen=True)
class PodInfo:
    namespace: str
    name: str
    uid: str = ""


class PodSourceError(TryAgainError):
    """The source cannot tell whether a pod exists right now."""


class PodSource(Protocol):
    def lookup(self, namespace: str, name: str) -> PodInfo | None:
        """The pod as it exists now, None if it does not; PodSourceError if unknown."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class ClaimSource(Protocol):
    """Where the reconciler learns whether an IPAMClaim exists (ipam.claimref): answered like pods."""

    def claim_uid(self, namespace: str, name: str) -> str | None:
        """The claim's UID, None if it does not exist; PodSourceError if unknown."""
        ...


class FilePodSource:
    """Pods listed in a file, read once (a test double and a manual drill; not for large clusters)."""

    def __init__(self, path: str) -> None:
        try:
            with open(path, "rb") as fh:
                data = fh.read()
        except OSError as e:
            raise ConfigError(f"pods file {path}: {e.strerror}") from None
        text = data.strip()
        items = (
            jsonio.loads(text, f"pods file {path}")
            if text.startswith(b"[")
            else [jsonio.loads(line, f"pods file {path}") for line in text.splitlines() if line.strip()]
        )
        self.pods: dict[tuple[str, str], PodInfo] = {}
        for i, item in enumerate(items):
            if not isinstance(item, dict) or not item.get("name"):
                raise ConfigError(f"pods file {path}[{i}]: expected an object with namespace, name, uid")
            pod = PodInfo(str(item.get("namespace", "default")), str(item["name"]), str(item.get("uid", "")))
            self.pods[(pod.namespace, pod.name)] = pod

    def lookup(self, namespace: str, name: str) -> PodInfo | None:
        return self.pods.get((namespace, name))

    def close(self) -> None:
        pass
