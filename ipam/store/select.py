"""Open the store a configuration names. Store modules are imported only here and only the one asked
for, so a plugin run never imports a client library it does not use. Each store module exposes
`open_store(conf: StoreConfig) -> Store`."""

from __future__ import annotations

import importlib

from ipam.config import StoreConfig
from ipam.store.base import Store

MODULES = {"local": "ipam.store.local", "kubernetes": "ipam.store.kube", "etcd": "ipam.store.etcd"}


def open_store(conf: StoreConfig) -> Store:
    module = importlib.import_module(MODULES[conf.datastore])
    store: Store = module.open_store(conf)
    return store
