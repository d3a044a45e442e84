"""`"kubeconfig": "in-cluster"`: the pod's own ServiceAccount, as client-go's rest.InClusterConfig() takes
it (KUBERNETES_SERVICE_HOST/_PORT, the projected token and ca.crt), no cluster DNS involved."""

from __future__ import annotations

from pathlib import Path

import pytest

from cni.errors import ConfigError
from ipam import kubeapi
from ipam.config import store_config

SVC = {"KUBERNETES_SERVICE_HOST": "198.18.0.1", "KUBERNETES_SERVICE_PORT": "443"}


def sa_dir(tmp_path: Path, namespace: str | None = "pycni-system", ca: bool = True) -> Path:
    d = tmp_path / "serviceaccount"
    d.mkdir()
    (d / "token").write_text("PYCNI-SECRET-token")
    if ca:
        (d / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    if namespace is not None:
        (d / "namespace").write_text(namespace)
    return d


def test_server_token_ca_and_namespace_come_from_the_pod(tmp_path: Path) -> None:
    d = sa_dir(tmp_path)
    conf = kubeapi.in_cluster_config(SVC, str(d))
    assert conf.server == "https://198.18.0.1:443"
    assert (conf.token_file, conf.ca_file) == (str(d / "token"), str(d / "ca.crt"))
    assert conf.namespace == "pycni-system"
    assert conf.token == "" and "PYCNI-SECRET" not in repr(conf)  # the file is re-read, never copied
    assert conf.path == kubeapi.IN_CLUSTER


def test_ipv6_service_address_is_bracketed(tmp_path: Path) -> None:
    env = {"KUBERNETES_SERVICE_HOST": "2001:db8::1", "KUBERNETES_SERVICE_PORT": "6443"}
    conf = kubeapi.in_cluster_config(env, str(sa_dir(tmp_path)))
    assert conf.server == "https://[2001:db8::1]:6443"


def test_without_namespace_file_or_ca(tmp_path: Path) -> None:
    conf = kubeapi.in_cluster_config(SVC, str(sa_dir(tmp_path, namespace=None, ca=False)))
    assert conf.namespace == kubeapi.DEFAULT_NAMESPACE and conf.ca_file == ""  # system CAs, as client-go


@pytest.mark.parametrize("env", [{}, {"KUBERNETES_SERVICE_HOST": "198.18.0.1"},
                                 {"KUBERNETES_SERVICE_PORT": "443"}])
def test_outside_a_pod_the_error_names_the_variables(tmp_path: Path, env: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match=r"kubernetes\.kubeconfig: in-cluster: KUBERNETES_SERVICE_HOST and "
                                          r"KUBERNETES_SERVICE_PORT"):
        kubeapi.in_cluster_config(env, str(sa_dir(tmp_path)))


def test_without_a_token_the_error_names_the_file(tmp_path: Path) -> None:
    d = sa_dir(tmp_path)
    (d / "token").unlink()
    with pytest.raises(ConfigError, match=f"no ServiceAccount token at {d / 'token'}"):
        kubeapi.in_cluster_config({"KUBERNETES_SERVICE_HOST": "h", "KUBERNETES_SERVICE_PORT": "1"}, str(d))


def test_load_kubeconfig_takes_the_in_cluster_value_from_the_process_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ConfigError, match="in-cluster: KUBERNETES_SERVICE_HOST"):
        kubeapi.load_kubeconfig(kubeapi.IN_CLUSTER)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "198.18.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    if Path(kubeapi.SA_DIR, "token").exists():  # only inside a pod
        assert kubeapi.load_kubeconfig(kubeapi.IN_CLUSTER).server == "https://198.18.0.1:443"
    else:
        with pytest.raises(ConfigError, match=f"no ServiceAccount token at {kubeapi.SA_DIR}/token"):
            kubeapi.load_kubeconfig(kubeapi.IN_CLUSTER)


def test_the_store_config_accepts_it() -> None:
    conf = store_config({"datastore": "kubernetes", "kubernetes": {"kubeconfig": kubeapi.IN_CLUSTER}})
    assert conf.datastore == "kubernetes" and conf.kubernetes.kubeconfig == "in-cluster"
