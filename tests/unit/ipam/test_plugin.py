"""The whereabouts plugin through skel (in-process) on the local store, and as a process: result
shapes per version, error objects and codes, GC keys, and the import boundary (no pyroute2)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cni import jsonio, skel
from tests.logtee import PYTHONPATH
from tests.nsutil import REPO

ARGS = "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=pod-a;K8S_POD_UID=uid-a"


@pytest.fixture
def conf(tmp_path: Path) -> dict[str, Any]:
    flat = tmp_path / "whereabouts.conf"
    flat.write_text("{}")
    return {
        "cniVersion": "1.1.0",
        "name": "netA",
        "type": "macvlan",
        "ipam": {
            "type": "whereabouts",
            "range": "198.51.100.0/24",
            "gateway": "198.51.100.1",
            "ipRanges": [{"range": "2001:db8::/64"}],
            "routes": [{"dst": "198.18.0.0/15"}],
            "datastore": "local",
            "local_db": str(tmp_path / "db" / "ipam.db"),
            "configuration_path": str(flat),
        },
    }


def call(
    command: str,
    conf: dict[str, Any],
    cid: str = "c1",
    ifname: str = "net1",
    args: str = ARGS,
    extra: dict[str, str] | None = None,
) -> tuple[int, Any]:
    env = {
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": cid,
        "CNI_NETNS": "/run/netns/none",
        "CNI_IFNAME": ifname,
        "CNI_PATH": "/usr/lib/cni",
        "CNI_ARGS": args,
        "NODENAME": "node1",
        **(extra or {}),
    }
    out = io.BytesIO()
    rc = skel.run("whereabouts", env, io.BytesIO(jsonio.dumps(conf)), out)
    text = out.getvalue()
    return rc, jsonio.loads(text) if text.strip() else None


def test_add_result_and_idempotency(conf: dict[str, Any]) -> None:
    rc, out = call("ADD", conf)
    assert rc == 0, out
    assert out == {
        "cniVersion": "1.1.0",
        "ips": [{"address": "198.51.100.2/24", "gateway": "198.51.100.1"}, {"address": "2001:db8::1/64"}],
        "routes": [{"dst": "198.18.0.0/15"}],
    }
    assert call("ADD", conf)[1] == out
    rc, other = call("ADD", conf, cid="c2", args="K8S_POD_NAMESPACE=ns;K8S_POD_NAME=pod-b")
    assert other["ips"][0]["address"] == "198.51.100.3/24"


@pytest.mark.parametrize("version", ["0.2.0", "0.3.1", "0.4.0", "1.0.0"])
def test_result_in_every_version(conf: dict[str, Any], version: str) -> None:
    rc, out = call("ADD", {**conf, "cniVersion": version})
    assert rc == 0, out
    if version == "0.2.0":
        assert out["ip4"]["ip"] == "198.51.100.2/24" and out["ip6"]["ip"] == "2001:db8::1/64"
    else:
        assert [ip["address"] for ip in out["ips"]] == ["198.51.100.2/24", "2001:db8::1/64"]
        assert ("version" in out["ips"][0]) == version.startswith("0.")


def test_old_versions_cannot_carry_two_addresses_of_a_family(conf: dict[str, Any]) -> None:
    conf["ipam"]["addresses"] = [{"address": "198.51.100.250/24"}]
    rc, out = call("ADD", {**conf, "cniVersion": "0.2.0"})
    assert rc == 1 and out["code"] == 7 and "one IPv4 address" in out["msg"]
    rc, out = call("ADD", {**conf, "cniVersion": "0.3.1"})
    assert rc == 0 and len(out["ips"]) == 3  # the failed 0.2.0 ADD allocated nothing: .2 is still free
    assert out["ips"][0]["address"] == "198.51.100.2/24" and out["ips"][2]["address"] == "198.51.100.250/24"


def test_del_check_status_gc(conf: dict[str, Any]) -> None:
    assert call("ADD", conf)[0] == 0
    assert call("ADD", conf, cid="c2", ifname="net2")[0] == 0
    assert call("CHECK", conf)[0] == 0
    assert call("STATUS", conf) == (0, None)
    rc, out = call("GC", {**conf, "cni.dev/valid-attachments": [{"containerID": "c1", "ifname": "net1"}]})
    assert rc == 0, out
    rc, out = call("CHECK", conf, cid="c2", ifname="net2")
    assert rc == 1 and out["code"] == 105 and "no allocation" in out["msg"]
    assert call("DEL", conf) == (0, None)
    assert call("DEL", conf) == (0, None)
    rc, out = call("CHECK", conf)
    assert rc == 1 and out["code"] == 105


def test_legacy_gc_key(conf: dict[str, Any]) -> None:
    call("ADD", conf)
    call("ADD", conf, cid="c2", args="K8S_POD_NAMESPACE=ns;K8S_POD_NAME=pod-b")
    assert call("GC", {**conf, "cni.dev/attachments": [{"containerID": "c2", "ifname": "net1"}]})[0] == 0
    assert (
        call("ADD", conf, cid="c3", args="K8S_POD_NAMESPACE=ns;K8S_POD_NAME=pod-c")[1]["ips"][0]["address"]
        == "198.51.100.2/24"
    )


def test_gc_without_attachments_releases_nothing(conf: dict[str, Any]) -> None:
    call("ADD", conf)
    assert call("GC", conf)[0] == 0
    assert call("CHECK", conf)[0] == 0


def test_exhausted_is_our_code(conf: dict[str, Any]) -> None:
    conf["ipam"]["range"] = "198.51.100.0/30"
    conf["ipam"]["gateway"] = "198.51.100.1"
    assert call("ADD", conf)[0] == 0
    rc, out = call("ADD", conf, cid="c2", args="K8S_POD_NAMESPACE=ns;K8S_POD_NAME=pod-b")
    assert rc == 1 and out["code"] == 100 and "198.51.100.0/30" in out["msg"]


def test_bad_config_is_code_7_naming_the_field(conf: dict[str, Any]) -> None:
    conf["ipam"]["exclude"] = ["198.51.100.0/28", "198.51.99.0/28"]
    rc, out = call("ADD", conf)
    assert rc == 1 and out["code"] == 7 and out["msg"].startswith("ipam.exclude[1]:")


def test_requested_addresses_from_runtime_config_and_cni_args(conf: dict[str, Any]) -> None:
    """The local store through skel: exactly the requested address (the other family allocated), code
    109 naming the holder for a second pod (nothing of it written), DEL frees it, code 7 for one the
    config cannot give."""
    asked = {**conf, "runtimeConfig": {"ips": ["198.51.100.77/24"]}}
    rc, out = call("ADD", asked)
    assert rc == 0, out
    assert [ip["address"] for ip in out["ips"]] == ["198.51.100.77/24", "2001:db8::1/64"]
    assert call("ADD", asked)[1] == out
    assert call("CHECK", {**asked, "prevResult": out})[0] == 0
    rc, err = call("CHECK", {**asked, "prevResult": out, "runtimeConfig": {"ips": ["198.51.100.78"]}})
    assert rc == 1 and err["code"] == 105 and "not the requested 198.51.100.78" in err["msg"], err
    other = "K8S_POD_NAMESPACE=ns;K8S_POD_NAME=pod-b;IP=198.51.100.77"
    rc, err = call("ADD", conf, cid="c2", args=other)
    assert rc == 1 and err["code"] == 109
    assert err["msg"] == "requested address 198.51.100.77 is held by pod ns/pod-a (container c1 net1)"
    rc, out = call("ADD", conf, cid="c3", args="K8S_POD_NAMESPACE=ns;K8S_POD_NAME=pod-c")
    assert [ip["address"] for ip in out["ips"]] == ["198.51.100.2/24", "2001:db8::2/64"]  # pod-b left none
    assert call("DEL", asked)[0] == 0
    rc, out = call("ADD", conf, cid="c2", args=other)
    assert rc == 0 and out["ips"][0]["address"] == "198.51.100.77/24"
    rc, err = call("ADD", {**conf, "runtimeConfig": {"ips": ["198.51.100.1"]}}, cid="c4")
    assert rc == 1 and err["code"] == 7
    assert err["msg"] == (
        "runtimeConfig.ips[0]: 198.51.100.1 is the gateway: not allocatable in range 198.51.100.0/24 "
        "198.51.100.1-198.51.100.254"
    )


def test_unreachable_store_is_11_on_add_and_del_and_50_on_status(
    conf: dict[str, Any], tmp_path: Path
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    conf["ipam"]["local_db"] = str(blocker / "ipam.db")
    for command in ("ADD", "DEL"):
        rc, out = call(command, conf)
        assert rc == 1 and out["code"] == 11, out
    rc, out = call("STATUS", conf)
    assert rc == 1 and out["code"] == 50


def netop_conf(flat: Path, version: str = "0.3.1") -> dict[str, Any]:
    """A NAD as the NVIDIA Network Operator renders it: no store settings (the node's flat file has
    them); configuration_path stands in for the default flat file locations (tests never write there)."""
    return {
        "cniVersion": version,
        "name": "netop",
        "type": "macvlan",
        "ipam": {"type": "whereabouts", "range": "198.51.100.0/24", "exclude": ["198.51.100.0/28"],
                 "configuration_path": str(flat)},
    }


def test_no_store_configured_add_is_code_7_and_writes_nothing(tmp_path: Path) -> None:
    flat = tmp_path / "whereabouts.d" / "whereabouts.conf"
    before = set(tmp_path.rglob("*"))
    rc, out = call("ADD", netop_conf(flat))
    assert rc == 1 and out["code"] == 7, out
    assert out["msg"].startswith("ipam.datastore: no store configured"), out
    assert f"no flat file at {flat}, " in out["details"] and '"datastore": "local"' in out["details"], out
    assert set(tmp_path.rglob("*")) == before


def test_no_store_configured_del_and_gc_succeed_check_is_7_status_is_50(tmp_path: Path) -> None:
    """DEL and GC have nothing to release (no ADD could allocate under this config); CHECK cannot find
    the allocation it checks; STATUS says no ADD can succeed yet (code 50: the runtime waits)."""
    flat = tmp_path / "whereabouts.d" / "whereabouts.conf"
    conf = netop_conf(flat, "1.1.0")
    before = set(tmp_path.rglob("*"))
    assert call("DEL", conf) == (0, None)
    gc = {**conf, "cni.dev/valid-attachments": [{"containerID": "c2", "ifname": "net1"}]}
    assert call("GC", gc) == (0, None)
    rc, out = call("CHECK", conf)
    assert rc == 1 and out["code"] == 7 and out["msg"].startswith("ipam.datastore:"), out
    rc, out = call("STATUS", conf)
    assert rc == 1 and out["code"] == 50 and out["msg"].startswith("ipam.datastore:"), out
    assert str(flat) in out["details"]
    assert set(tmp_path.rglob("*")) == before


def test_a_flat_file_choosing_the_local_store_serves_the_netop_nad(tmp_path: Path) -> None:
    flat = tmp_path / "whereabouts.d" / "whereabouts.conf"
    flat.parent.mkdir()
    flat.write_bytes(jsonio.dumps({"datastore": "local", "local_db": str(tmp_path / "db" / "ipam.db")}))
    rc, out = call("ADD", netop_conf(flat))
    assert rc == 0 and out["ips"][0]["address"] == "198.51.100.16/24", out
    assert (tmp_path / "db" / "ipam.db").exists()
    assert call("DEL", netop_conf(flat)) == (0, None)


def test_missing_ipam_section() -> None:
    rc, out = call("ADD", {"cniVersion": "1.0.0", "name": "n", "type": "whereabouts"})
    assert rc == 1 and out["code"] == 7 and out["msg"].startswith("ipam:")


def test_ipam_path_never_imports_pyroute2(conf: dict[str, Any]) -> None:
    """A fresh interpreter runs ADD exactly as `python -m cni whereabouts` does, then lists sys.modules
    (importlib.import_module bypasses -X importtime, so that cannot be the probe)."""
    env = {
        **os.environ,
        "CNI_COMMAND": "ADD",
        "CNI_CONTAINERID": "c9",
        "CNI_NETNS": "/run/netns/none",
        "CNI_IFNAME": "net1",
        "CNI_PATH": "/usr/lib/cni",
        "CNI_ARGS": ARGS,
        "PYTHONPATH": PYTHONPATH,
    }
    code = (
        "import sys; from cni.__main__ import main; rc = main(['python', 'whereabouts']); "
        "sys.stderr.write('MODULES ' + ' '.join(sorted(sys.modules)))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        input=jsonio.dumps(conf),
        env=env,
        capture_output=True,
        check=False,
        cwd=REPO,
    )
    assert b'"ips"' in proc.stdout, proc.stdout + proc.stderr
    imported = set(proc.stderr.decode().rsplit("MODULES ", 1)[1].split())
    assert {"ipam.plugin", "ipam.engine", "ipam.store.local", "sqlite3"} <= imported  # the probe works
    assert not [m for m in imported if m.startswith("pyroute2") or m.startswith("cni.netlink")]
    assert not [m for m in imported if m.split(".")[0] in ("kubernetes", "etcd3", "grpc", "yaml")]
