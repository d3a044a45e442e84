"""Plugin name -> module. The multicall entry dispatches on it, the bundle build makes one CNI_PATH entry
per name from it and takes its hidden-import list from it: one list, not two."""

from __future__ import annotations

PLUGINS: dict[str, str] = {
    "macvlan": "cni.plugins.macvlan",
    "host-device": "cni.plugins.hostdevice",
    "sriov": "cni.plugins.sriov",
    "whereabouts": "ipam.plugin",
}

# IPAM types served in-process when CNI_PATH resolves to this bundle (see cni.delegate).
IN_PROCESS_IPAM: dict[str, str] = {"whereabouts": "ipam.plugin"}

# Entries of the bundle that are not CNI plugins: name -> module with `main(argv: list[str]) -> int`.
TOOLS: dict[str, str] = {
    "pycni-install": "bundler.install",
    "pycni-ipam": "ipam.cli",
    "pycni-agent": "cni.agent.main",
}

# Modules imported lazily on some path (not visible to PyInstaller's import scan).
LAZY_MODULES: tuple[str, ...] = (
    *PLUGINS.values(),
    *IN_PROCESS_IPAM.values(),
    *TOOLS.values(),
    "cni.sriov.settings",
    "ipam.store.local",  # stores are picked by name in ipam.store.select
    "ipam.store.kube",
    "ipam.kubepods",  # the reconciler's `--pods kubernetes` (ipam.podsource)
    "ipam.store.etcd",
)


def module_for(name: str) -> str | None:
    return PLUGINS.get(name)


def resolve(entry: str) -> str | None:
    """The plugin or tool an executable name stands for: exact, or a prefixed plugin name installed with
    `pycni-install --prefix` ("pycni-macvlan" -> "macvlan"; the longest plugin name wins)."""
    if entry in PLUGINS or entry in TOOLS:
        return entry
    matches = [p for p in PLUGINS if entry.endswith(p) and len(entry) > len(p)]
    return max(matches, key=len) if matches else None


def entries() -> tuple[str, ...]:
    """Every executable name the bundle answers to (one symlink each in the cni-bin dir)."""
    return (*sorted(PLUGINS), *sorted(TOOLS))
