"""pyroute2 as a message codec only, and only for SR-IOV VF lists (cni.sriov.vf): links, addresses and
routes are encoded by cni.netlink.wire, which keeps pyroute2 off every other plugin call.

`import pyroute2` runs the package __init__, which pulls in asyncio, ssl, multiprocessing and every
netlink family: 160-200 ms per call on our machines. The message classes we need cost ~30 ms on
their own. So we register a bare package object for `pyroute2` (its real search path, no __init__
executed) and import only the rtnl message modules. pyroute2 is pinned in pyproject.toml because of
this; the transport (cni.netlink.socket) is our own small synchronous one."""

from __future__ import annotations

import importlib.util
import sys
import types


def _bare_package() -> None:
    if "pyroute2" in sys.modules:
        return
    spec = importlib.util.find_spec("pyroute2")
    if spec is None or spec.submodule_search_locations is None:
        raise ImportError("pyroute2 is not installed")
    pkg = types.ModuleType("pyroute2")
    pkg.__path__ = list(spec.submodule_search_locations)
    pkg.__spec__ = spec
    pkg.__file__ = spec.origin
    sys.modules["pyroute2"] = pkg


def _light_config() -> None:
    """pyroute2.config imports multiprocessing and platform and runs platform.uname() (~4 ms per call)
    for settings of pyroute2's sockets and IPDB; the message classes read four of them. Those four are
    here; any other attribute loads the real module on first use (PEP 562)."""
    if "pyroute2.config" in sys.modules:
        return
    cfg = types.ModuleType("pyroute2.config")
    real: list[types.ModuleType] = []

    def full_config(name: str) -> object:
        if name.startswith("__"):
            raise AttributeError(name)  # the import system probing (__path__ ...): a plain module
        if not real:
            import importlib.machinery

            path = sys.modules["pyroute2"].__path__
            spec = importlib.machinery.PathFinder.find_spec("pyroute2.config", path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            real.append(module)
        return getattr(real[0], name)

    cfg.AF_BRIDGE, cfg.AF_NETLINK = 7, 16  # type: ignore[attr-defined]
    cfg.data_plugins_pkgs, cfg.data_plugins_path = [], []  # type: ignore[attr-defined]
    cfg.__getattr__ = full_config  # type: ignore[method-assign]
    sys.modules["pyroute2.config"] = cfg
    sys.modules["pyroute2"].config = cfg  # type: ignore[attr-defined]


_bare_package()
_light_config()

from pyroute2.netlink import nla, nlmsg_atoms  # noqa: E402
from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg  # noqa: E402
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg, macvx_data  # noqa: E402
from pyroute2.netlink.rtnl.rtmsg import rtmsg  # noqa: E402


class macvlan_data(macvx_data):  # type: ignore[misc]
    """macvlan IFLA_INFO_DATA with the broadcast-queue attributes pyroute2 0.9 lacks."""

    nla_map = (
        *macvx_data.nla_map,
        ("IFLA_MACVLAN_BC_QUEUE_LEN", "uint32"),
        ("IFLA_MACVLAN_BC_QUEUE_LEN_USED", "uint32"),
        ("IFLA_MACVLAN_BC_CUTOFF", "int32"),
    )


ifinfmsg.ifinfo.register_link_kind(module={"macvlan": macvlan_data})

__all__ = ["ifaddrmsg", "ifinfmsg", "nla", "nlmsg_atoms", "rtmsg"]
