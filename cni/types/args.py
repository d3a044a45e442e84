"""CNI_ARGS as runtimes send them: 'IgnoreUnknown=true;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;MAC=..'."""

from __future__ import annotations

from cni.errors import EnvError
from cni.types.valueclass import valueclass


@valueclass
class CniArgs:
    pairs: tuple[tuple[str, str], ...] = ()

    def get(self, key: str, default: str = "") -> str:
        for k, v in self.pairs:
            if k == key:
                return v
        return default

    @property
    def pod_namespace(self) -> str:
        return self.get("K8S_POD_NAMESPACE")

    @property
    def pod_name(self) -> str:
        return self.get("K8S_POD_NAME")

    @property
    def pod_uid(self) -> str:
        return self.get("K8S_POD_UID")

    @property
    def pod_ref(self) -> str:
        ns, name = self.pod_namespace, self.pod_name
        return f"{ns}/{name}" if name else ""


def parse(text: str) -> CniArgs:
    """Split 'K=V;K=V'. A pair must have exactly one '='; unknown keys are always tolerated
    (runtimes add their own, and Multus always sends IgnoreUnknown=true)."""
    pairs: list[tuple[str, str]] = []
    for item in text.split(";"):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or "=" in value or not key:
            raise EnvError(f'CNI_ARGS: invalid pair "{item}" (expected KEY=VALUE)')
        if any("\udc80" <= ch <= "\udcff" for ch in item):  # bytes that were not UTF-8 (surrogateescape)
            raise EnvError(f"CNI_ARGS: {key or 'a pair'} is not valid UTF-8 (stores and results need text)")
        pairs.append((key, value))
    return CniArgs(tuple(pairs))
