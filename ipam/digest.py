"""SHA-256 (hex) for the node lock's file names, the CRD owners' fingerprints and the etcd token cache's
name, with hashlib imported on first use: its OpenSSL binding loads libcrypto, which a cluster store's
ssl loads anyway, so a call pays for it once that happened, and a local-store call never does."""

from __future__ import annotations


def sha256_hex(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()
