"""Plugin name -> module. The multicall entry dispatches on it and the PyInstaller build takes its
hidden-import list from it, so there is one list, not two."""

from __future__ import annotations

PLUGINS: dict[str, str] = {
    "macvlan": "cni.plugins.macvlan",
    "host-device": "cni.plugins.hostdevice",
    "sriov": "cni.plugins.sriov",
    "whereabouts": "ipam.plugin",
}

# Modules imported lazily on some path (not visible to PyInstaller's import scan).
LAZY_MODULES: tuple[str, ...] = (
    *PLUGINS.values(),
    "cni.sriov.settings",
    "cni.sriov.fakevf",  # the recording VF seam tests select with PYCNI_SRIOV_FAKE_PF
    "ipam.store.local",  # stores are picked by name in ipam.store.select
)


def module_for(name: str) -> str | None:
    return PLUGINS.get(name)


# IPAM types served in-process when CNI_PATH resolves to this bundle (see cni.delegate).
IN_PROCESS_IPAM: dict[str, str] = {"whereabouts": "ipam.plugin"}
