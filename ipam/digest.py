"""SHA-256 for the node lock's file names and the CRD owners' fingerprints, without hashlib.

hashlib's import loads its OpenSSL binding (_hashlib: libcrypto, every OpenSSL digest registered), ~2 ms
of each plugin call, ~1 ms more even after ssl loaded libcrypto. CPython's own SHA-256 (_sha2, what
hashlib itself falls back to without OpenSSL) gives the same digest for ~0.1 ms; hashlib stays the
fallback for an interpreter without _sha2 (before 3.12 it was _sha256)."""

from __future__ import annotations

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing would cost every call
if TYPE_CHECKING:
    from hashlib import sha256
else:
    try:
        from _sha2 import sha256
    except ImportError:  # pragma: no cover (CPython 3.12 has it)
        from hashlib import sha256

__all__ = ["sha256"]
