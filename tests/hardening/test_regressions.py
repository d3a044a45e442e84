"""One fixed case per defect the fuzz and fault runs found (each was code 999 or a leak before)."""

from __future__ import annotations

import pytest

from cni import jsonio
from tests.hardening.fuzzlab import FuzzLab

pytestmark = pytest.mark.root



def error(lab: FuzzLab, plugin: str, env: dict[str, str], conf: dict[str, object]) -> tuple[int, str]:
    got = lab.call(plugin, env, jsonio.dumps(conf))
    assert got.rc == 1, got.raw
    assert lab.leftovers() == []
    return got.error()


def test_cni_args_not_utf8_is_code_4(lab: FuzzLab) -> None:
    """Was 999: SQLite could not encode the pod name."""
    env = lab.env("ADD", CNI_ARGS="K8S_POD_NAMESPACE=a;K8S_POD_NAME=\udcff\udcfe")
    code, msg = error(lab, "whereabouts", env, lab.conf("whereabouts"))
    assert code == 4 and "CNI_ARGS" in msg and "K8S_POD_NAME" in msg


@pytest.mark.parametrize("var", ["CNI_NETNS", "CNI_CONTAINERID", "CNI_IFNAME", "CNI_ARGS", "CNI_PATH"])
def test_nul_byte_in_env_is_code_4(lab: FuzzLab, var: str) -> None:
    """Was 999 ("embedded null byte"): impossible through exec, possible for an in-process caller."""
    env = lab.env("ADD")
    env[var] = env[var][:3] + "\x00" + env[var][3:]
    code, msg = error(lab, "sriov", env, lab.conf("sriov"))
    assert code == 4 and var in msg and "NUL" in msg


@pytest.mark.parametrize(("plugin", "field"), [("macvlan", "master"), ("host-device", "device")])
def test_huge_interface_name_is_code_7(lab: FuzzLab, plugin: str, field: str) -> None:
    """Was 999: a 64 KiB name overflowed the netlink attribute length."""
    for name in ("x" * 65531, "x" * 16, "a/b"):
        code, msg = error(lab, plugin, lab.env("ADD"), lab.conf(plugin, **{field: name}))
        assert code == 7 and msg.startswith(f"{field}: "), msg


def test_device_gc_keeps_the_failure_code(lab: FuzzLab) -> None:
    """Was 999 for any GC failure: a bad ipam section is code 7."""
    conf = lab.conf("host-device", cniVersion="1.1.0")
    conf["ipam"]["type"] = "nosuchipam"
    conf["cni.dev/valid-attachments"] = []
    code, msg = error(lab, "host-device", lab.env("GC"), conf)
    assert code == 7 and "nosuchipam" in msg


def test_refused_ipam_config_is_no_incomplete_rollback(lab: FuzzLab) -> None:
    """Was: code 7 whose details claimed 'rollback incomplete' (the IPAM refused its DEL as well)."""
    conf = lab.conf("macvlan", ipam=lab.ipam(range="198.51.100.0/33"))
    got = lab.call("macvlan", lab.env("ADD"), jsonio.dumps(conf))
    assert got.rc == 1 and got.out["code"] == 7 and "ipam.range" in got.out["msg"], got.raw
    assert "rollback incomplete" not in got.out["details"], got.raw
    assert lab.leftovers() == []


def test_record_that_cannot_be_saved_leaves_no_owner(lab: FuzzLab) -> None:
    """Was: an owner record left behind when the attachment record could not be written (a container
    id longer than a file name may be)."""
    env = lab.env("ADD", CNI_CONTAINERID="c" * 300)
    code, msg = error(lab, "sriov", env, lab.conf("sriov"))
    assert code == 5 and "File name too long" in msg, msg
