"""bundler/: the manifests validate offline (kubernetes-validate --strict), grant exactly ipam/rbac.py,
the kustomization lists them all, the DaemonSet and reconciler are shaped as promised, the CRDs are the
upstream ones, and the Dockerfile and every command agree with the bundle layout."""

from __future__ import annotations

import copy
import os
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from bundler import build, cli
from cni.registry import entries
from ipam import rbac
from tests import kubeup
from tests.nsutil import REPO

MANIFESTS = REPO / "bundler" / "manifests"
UPSTREAM_CRDS = kubeup.UPSTREAM / "whereabouts-crds"
IMAGE_ROOT = "/pycni/cni-bin"


def resource_files() -> list[Path]:
    return sorted(p for p in MANIFESTS.rglob("*.yaml") if p.name != "kustomization.yaml")


def docs() -> list[dict[str, Any]]:
    return [d for p in resource_files() for d in yaml.safe_load_all(p.read_text()) if d]


def by_kind(kind: str) -> list[dict[str, Any]]:
    return [d for d in docs() if d["kind"] == kind]


@pytest.mark.parametrize("path", resource_files(), ids=lambda p: str(p.relative_to(MANIFESTS)))
def test_validates_strictly_offline(path: Path) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


def test_strict_validation_is_not_a_noop() -> None:
    ds = copy.deepcopy(by_kind("DaemonSet")[0])
    ds["spec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, kubernetes_validate.latest_version(), strict=True)


def test_kustomization_lists_every_manifest_and_sets_the_image() -> None:
    kust = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    assert sorted(kust["resources"]) == sorted(str(p.relative_to(MANIFESTS)) for p in resource_files())
    images = {c["image"].split(":")[0] for kind in ("DaemonSet", "Deployment")
              for c in by_kind(kind)[0]["spec"]["template"]["spec"]["containers"]}
    assert images == {i["name"] for i in kust["images"]}


@pytest.mark.skipif(bool(kubeup.shared_missing("whereabouts-crds")),
                    reason=kubeup.shared_missing("whereabouts-crds"))
def test_crds_are_the_upstream_ones() -> None:
    crds = sorted(UPSTREAM_CRDS.glob("*.yaml"))
    assert crds, f"no CRD in {UPSTREAM_CRDS}"
    for src in crds:
        assert (MANIFESTS / "crds" / src.name).read_bytes() == src.read_bytes(), src.name


def granted(sa: str) -> set[tuple[str, str, str, bool]]:
    """(group, resource, verb, namespaced) granted to a service account through the bindings."""
    roles = {(d["kind"], d["metadata"]["name"]): d for d in docs() if d["kind"] in ("Role", "ClusterRole")}
    out = set()
    for b in docs():
        if b["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(s["kind"] == "ServiceAccount" and s["name"] == sa for s in b["subjects"]):
            continue
        role = roles[(b["roleRef"]["kind"], b["roleRef"]["name"])]
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for res in rule["resources"]:
                    out |= {(group, res, verb, role["kind"] == "Role") for verb in rule["verbs"]}
    return out


@pytest.mark.parametrize(("sa", "role"), [("pycni-node", rbac.NODE), ("pycni-reconciler", rbac.RECONCILER)])
def test_rbac_grants_exactly_what_the_code_declares(sa: str, role: str) -> None:
    declared = {(r.group, r.resource, v, r.namespaced) for r in rbac.RULES[role] for v in r.verbs}
    assert granted(sa) == declared
    assert not any("*" in str(item) for item in granted(sa))


def test_rbac_require_refuses_undeclared_access() -> None:
    rbac.require(rbac.NODE, rbac.WHEREABOUTS, "ippools", "patch")
    with pytest.raises(rbac.NotGranted):
        rbac.require(rbac.NODE, rbac.WHEREABOUTS, "ippools", "update")  # pools are patched, never replaced
    with pytest.raises(rbac.NotGranted):
        rbac.require(rbac.NODE, "", "pods", "delete")  # the pod watch reads pods, never writes them


def container(kind: str) -> dict[str, Any]:
    c: dict[str, Any] = by_kind(kind)[0]["spec"]["template"]["spec"]["containers"][0]
    return c


def test_daemonset_runs_everywhere_with_limits() -> None:
    ds = by_kind("DaemonSet")[0]["spec"]["template"]["spec"]
    assert {"operator": "Exists"} in ds["tolerations"], "tolerates every taint, GPU nodes included"
    c = container("DaemonSet")
    assert c["resources"]["requests"] and c["resources"]["limits"]
    assert c["securityContext"]["privileged"] is False
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    paths = {v["hostPath"]["path"] for v in ds["volumes"] if "hostPath" in v}
    assert paths == {"/opt/cni/bin", "/etc/cni/net.d", *AGENT_HOST_PATHS}
    env = {e["name"]: e for e in c["env"]}
    assert env["NODENAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


AGENT_HOST_PATHS = {"/run/pycni", "/var/run/netns", "/var/lib/cni", "/var/log",
                    "/var/run/k8s.cni.cncf.io/devinfo"}


def test_daemonset_runs_the_agent_with_the_host_paths_it_serves() -> None:
    """The agent opens what requests name by host path: the same paths inside its container, host pids
    for /proc/<pid>/ns/net, and a command its own CLI accepts. No mount propagation anywhere: the CRI
    refuses HostToContainer/Bidirectional hostPath mounts on a node whose "/" is private, and the agent
    needs none (the shim passes the pod namespace's descriptor: tests/integration/test_agent.py
    test_a_pod_namespace_the_agent_cannot_see_by_path_is_served_through_the_callers_descriptor)."""
    spec = by_kind("DaemonSet")[0]["spec"]["template"]["spec"]
    assert spec["hostNetwork"] is True and spec["hostPID"] is True
    agent = next(c for c in spec["containers"] if c["name"] == "agent")
    volumes = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    mounts = {volumes[m["name"]]: m for m in agent["volumeMounts"]}
    assert all(path == m["mountPath"] for path, m in mounts.items()), "host paths at the same paths"
    assert set(mounts) == {"/opt/cni/bin", "/etc/cni/net.d", *AGENT_HOST_PATHS}
    every_mount = [m for c in spec["containers"] for m in c.get("volumeMounts", [])]
    assert [m for m in every_mount if "mountPropagation" in m] == []
    from cni.agent import client, main

    args = main.parse([expand(a, env_of(agent, docs())) for a in agent["command"][1:]])
    assert args.fifo == client.DEFAULT_FIFO
    assert os.path.dirname(args.fifo) in {m["mountPath"] for m in agent["volumeMounts"]}
    assert args.grace < spec["terminationGracePeriodSeconds"]


def test_daemonset_command_and_probe_parse_with_the_installer_cli() -> None:
    c = container("DaemonSet")
    args = cli.parse([expand(a, env_of(c, docs())) for a in c["command"][1:]])
    assert (str(args.cni_bin_dir), str(args.cni_conf_dir)) == ("/host/opt/cni/bin", "/host/etc/cni/net.d")
    assert not args.once and not args.uninstall, "long-running: verifies and repairs"
    probe = cli.parse(c["readinessProbe"]["exec"]["command"][1:])
    assert probe.probe and probe.ready_file == args.ready_file
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert str(args.ready_file.parent) in mounts


def test_reconciler_is_a_single_replica() -> None:
    dep = by_kind("Deployment")[0]["spec"]
    assert dep["replicas"] == 1 and dep["strategy"]["type"] == "Recreate"
    c = container("Deployment")
    assert c["securityContext"]["runAsNonRoot"] is True and c["resources"]["limits"]


def commands() -> list[list[str]]:
    out = []
    for kind in ("DaemonSet", "Deployment"):
        c = container(kind)
        out.append(c["command"])
        if "readinessProbe" in c:
            out.append(c["readinessProbe"]["exec"]["command"])
    return out


def dockerfile() -> tuple[list[tuple[str, str]], list[str]]:
    copies, entrypoint = [], []
    for line in (REPO / "bundler" / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY "):
            src, dst = shlex.split(line)[1:]
            copies.append((src, dst))
        elif line.startswith("ENTRYPOINT "):
            entrypoint = yaml.safe_load(line.split(None, 1)[1])
    return copies, entrypoint


def test_dockerfile_copies_the_bundle_layout() -> None:
    copies, entrypoint = dockerfile()
    layout = (REPO / "dist" / "cni-bin").relative_to(REPO)
    assert copies == [(str(layout), IMAGE_ROOT)]
    assert build.BUNDLE == "pycni" and entrypoint == [f"{IMAGE_ROOT}/pycni-install"]


def test_every_command_names_an_entry_of_the_bundle() -> None:
    for cmd in [*commands(), dockerfile()[1]]:
        exe = Path(cmd[0])
        assert str(exe.parent) == IMAGE_ROOT, cmd
        name = exe.name
        assert name in entries(), f"{name} is not a bundle entry"


def expand(arg: str, env: dict[str, str]) -> str:
    """$(VAR) references of a container command, as the kubelet expands them."""
    for name, val in env.items():
        arg = arg.replace(f"$({name})", val)
    return arg


def env_of(c: dict[str, Any], objects: list[dict[str, Any]], **fields: str) -> dict[str, str]:
    """A container's environment as the kubelet gives it: ConfigMap keys read from `objects`, downward
    API fields from `fields` (by fieldPath; a stand-in when not given)."""
    maps = {d["metadata"]["name"]: d.get("data") or {} for d in objects if d["kind"] == "ConfigMap"}
    out = {}
    for e in c.get("env", []):
        source = e.get("valueFrom", {})
        if "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            out[e["name"]] = str(maps[ref["name"]][ref["key"]])
        elif "fieldRef" in source:
            out[e["name"]] = fields.get(source["fieldRef"]["fieldPath"], "198.51.100.7")
        else:
            out[e["name"]] = str(e["value"])
    return out


def downward(c: dict[str, Any]) -> dict[str, str]:
    """A container's variables from the downward API: name -> fieldPath."""
    return {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in c["env"]
            if "fieldRef" in e.get("valueFrom", {})}  # fmt: skip


def node_dirs(objects: list[dict[str, Any]]) -> dict[str, str]:
    """The CNI directories the manifests (as shipped, or as an overlay renders them) give the node, checked
    to be one setting: the ConfigMap pycni-node's, the hostPaths of the volumes cni-bin and cni-conf, the
    agent's mounts of them (host paths at the same paths), the conf dir the installer writes into the
    flat file and kubeconfig (--host-cni-conf-dir), and the flat file the agent's pod watch reads
    (--pod-watch): the one the installer writes (bundler/hostconf.py)."""
    from bundler import hostconf
    from cni.agent import main

    setting = next(d for d in objects if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "pycni-node")
    dirs = {"cni-bin": str(setting["data"]["cni-bin-dir"]), "cni-conf": str(setting["data"]["cni-conf-dir"])}
    spec = next(d for d in objects if d["kind"] == "DaemonSet")["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in spec["containers"]}
    volumes = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    agent_mounts = {m["name"]: m["mountPath"] for m in containers["agent"]["volumeMounts"]}
    for name, path in dirs.items():
        assert volumes[name] == path, (name, volumes[name], path)
        assert agent_mounts[name] == path, (name, agent_mounts[name], path)
    installer = containers["installer"]
    args = cli.parse([expand(a, env_of(installer, objects)) for a in installer["command"][1:]])
    assert args.host_cni_conf_dir == dirs["cni-conf"], args.host_cni_conf_dir
    conf = hostconf.HostConf(args.host_cni_conf_dir, "kubernetes", "node-1", None)
    agent = containers["agent"]
    watch = main.parse([expand(a, env_of(agent, objects)) for a in agent["command"][1:]]).pod_watch
    assert watch == hostconf.host_path(conf, hostconf.FLAT), (watch, hostconf.host_path(conf, hostconf.FLAT))
    return {"bin": dirs["cni-bin"], "conf": dirs["cni-conf"]}


def test_the_installer_and_the_agent_take_the_conf_dir_from_one_setting() -> None:
    """Shipped: /opt/cni/bin and /etc/cni/net.d, in the ConfigMap pycni-node, and everything that names
    them agrees (node_dirs)."""
    assert node_dirs(docs()) == {"bin": "/opt/cni/bin", "conf": "/etc/cni/net.d"}


KUBECTL = shutil.which("kubectl")


@pytest.mark.skipif(KUBECTL is None, reason="kubectl (its kustomize renders the overlay) is not installed; "
                                            "the cluster suite needs it too")
@pytest.mark.parametrize("dirs", [None, ("/var/lib/rancher/cni/bin", "/var/lib/rancher/cni/net.d")],
                         ids=["as-shown", "other-dirs"])
def test_the_documented_overlay_moves_the_cni_dirs_everywhere_at_once(
        tmp_path: Path, dirs: tuple[str, str] | None) -> None:
    """docs/install.md's overlay for a node with other CNI directories (tests/docoverlay.py: its files as
    the page shows them, the two values of cni-dirs.yaml as shown or changed), rendered by kustomize:
    the installer, the agent's pod watch, the volumes and the agent's mounts all name the directories of
    cni-dirs.yaml, and no host path of the DaemonSet names a default directory any more."""
    from tests import docoverlay

    want = docoverlay.shown_dirs() if dirs is None else {"bin": dirs[0], "conf": dirs[1]}
    overlay = docoverlay.write(tmp_path, *(dirs or (None, None)))
    assert KUBECTL is not None
    out = subprocess.run([KUBECTL, "kustomize", str(overlay)], capture_output=True, text=True, check=False,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    objects = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert node_dirs(objects) == want
    spec = next(d for d in objects if d["kind"] == "DaemonSet")["spec"]["template"]["spec"]
    host_paths = [v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v]
    assert not {"/opt/cni/bin", "/etc/cni/net.d"} & set(host_paths), host_paths


def scrape_annotations(kind: str) -> tuple[str, int, str]:
    notes = by_kind(kind)[0]["spec"]["template"]["metadata"]["annotations"]
    return notes["prometheus.io/scrape"], int(notes["prometheus.io/port"]), notes["prometheus.io/path"]


def metrics_port(c: dict[str, Any]) -> int:
    ports = [p for p in c.get("ports", []) if p["name"] == "metrics"]
    assert len(ports) == 1 and ports[0]["protocol"] == "TCP", c.get("ports")
    port: int = ports[0]["containerPort"]
    return port


@pytest.mark.parametrize("node_ip", ["198.51.100.7", "2001:db8::7"])
def test_agent_serves_metrics_on_the_node_address_the_daemonset_declares(node_ip: str) -> None:
    """hostNetwork: the pod IP is the node's; the agent binds it (either family), on the port the
    container and the scrape annotations declare."""
    from cni.agent import main

    agent = next(c for c in by_kind("DaemonSet")[0]["spec"]["template"]["spec"]["containers"]
                 if c["name"] == "agent")
    assert downward(agent) == {"POD_IP": "status.podIP", "NODENAME": "spec.nodeName"}
    env = env_of(agent, docs(), **{"status.podIP": node_ip})
    args = main.parse([expand(a, env) for a in agent["command"][1:]])
    assert args.metrics == (node_ip, metrics_port(agent))
    assert scrape_annotations("DaemonSet") == ("true", metrics_port(agent), "/metrics")


def test_agent_watches_its_nodes_pods_with_what_the_daemonset_gives_it() -> None:
    """The pod watch (ipam/podwatch.py) runs when NODENAME is set: the DaemonSet sets it from the downward
    API, names the flat file the installer writes (node_dirs), and the node's ServiceAccount may list and
    watch pods (a ClusterRole: pods are in every namespace)."""
    from cni.agent import main

    agent = next(c for c in by_kind("DaemonSet")[0]["spec"]["template"]["spec"]["containers"]
                 if c["name"] == "agent")
    args = main.parse([expand(a, env_of(agent, docs())) for a in agent["command"][1:]])
    assert args.pod_watch == "/etc/cni/net.d/whereabouts.d/whereabouts.conf"
    assert downward(agent)["NODENAME"] == "spec.nodeName"
    role = next(d for d in by_kind("ClusterRole") if d["metadata"]["name"] == "pycni-node")
    assert [r for r in role["rules"] if r["apiGroups"] == [""]] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]


def test_agent_watches_ipamclaims_with_what_the_node_role_grants() -> None:
    """The claim watch (ipam/claimwatch.py) reads the flat file the installer writes, as the pod watch
    does (the conf dir of the ConfigMap: node_dirs), and the node's ServiceAccount may list and watch
    IPAMClaims in every namespace (a ClusterRole: claims are in the VMs' namespaces), get them and patch
    their status (the plugin's ADD, ipam/claims.py), nothing else of the group k8s.cni.cncf.io."""
    from cni.agent import main

    agent = next(c for c in by_kind("DaemonSet")[0]["spec"]["template"]["spec"]["containers"]
                 if c["name"] == "agent")
    args = main.parse([expand(a, env_of(agent, docs())) for a in agent["command"][1:]])
    assert args.claim_watch == args.pod_watch == "/etc/cni/net.d/whereabouts.d/whereabouts.conf"
    role = next(d for d in by_kind("ClusterRole") if d["metadata"]["name"] == "pycni-node")
    assert [r for r in role["rules"] if r["apiGroups"] == ["k8s.cni.cncf.io"]] == [
        {"apiGroups": ["k8s.cni.cncf.io"], "resources": ["ipamclaims"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["k8s.cni.cncf.io"], "resources": ["ipamclaims/status"], "verbs": ["patch"]}]
    assert {("k8s.cni.cncf.io", "ipamclaims", "get", False)} == {
        g for g in granted("pycni-reconciler") if g[0] == "k8s.cni.cncf.io"}


def test_reconciler_serves_metrics_where_the_deployment_declares() -> None:
    from ipam import cli as ipam_cli

    c = container("Deployment")
    args = ipam_cli.parser().parse_args(c["command"][1:])
    assert args.interval > 0, "metrics are served by a reconciler that keeps running"
    assert args.metrics == ("0.0.0.0", metrics_port(c))  # the pod's own network
    assert scrape_annotations("Deployment") == ("true", metrics_port(c), "/metrics")


def test_metrics_defaults_are_the_exporters() -> None:
    from cni import exporter
    from cni.agent import main
    from ipam import cli as ipam_cli

    assert exporter.default_address(exporter.AGENT) == main.DEFAULT_METRICS
    assert exporter.default_address(exporter.RECONCILER) == ipam_cli.DEFAULT_METRICS
