"""CNI error codes and the exceptions that carry them from where they are raised to skel."""

from __future__ import annotations


class Code:
    """Error codes: 1-99 from the CNI spec, 100+ ours, 999 internal. Plain ints, not an IntEnum: enum
    adds to every plugin process' imports, and only the numbers are ever printed (`CODES`)."""

    INCOMPATIBLE_VERSION = 1
    UNSUPPORTED_FIELD = 2
    UNKNOWN_CONTAINER = 3
    INVALID_ENV = 4
    IO_FAILURE = 5
    DECODING_FAILURE = 6
    INVALID_CONFIG = 7
    INVALID_NETNS = 8
    TRY_AGAIN_LATER = 11
    NOT_AVAILABLE = 50
    NOT_AVAILABLE_LIMITED = 51
    # ours
    POOL_EXHAUSTED = 100
    INTERFACE_EXISTS = 101
    DEVICE_BUSY = 102
    NETLINK = 103
    DAD_FAILED = 104
    CHECK_FAILED = 105
    ROLLBACK_INCOMPLETE = 106
    SLICE_FULL = 107  # IPAM node slices: this node's slice has no free address
    NO_SLICE = 108  # IPAM node slices: no slice for this node, and none free to assign
    ADDRESS_TAKEN = 109  # IPAM: a requested address is held by another attachment (the holder named)
    INTERNAL = 999


CODES = frozenset(v for k, v in vars(Code).items() if k.isupper())


class CniError(Exception):
    """An error with a CNI code; skel prints it as the error object."""

    code: int = Code.INTERNAL

    def __init__(self, msg: str, details: str = "", code: int | None = None) -> None:
        super().__init__(msg)
        self.msg = msg
        self.details = details
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return f"{self.msg}: {self.details}" if self.details else self.msg


class VersionError(CniError):
    """The config's cniVersion is not supported, or does not allow the command."""

    code = Code.INCOMPATIBLE_VERSION


class EnvError(CniError):
    """A CNI_* environment variable is missing or invalid."""

    code = Code.INVALID_ENV


class DecodeError(CniError):
    """stdin (or a delegate's output) is not valid JSON."""

    code = Code.DECODING_FAILURE


class ConfigError(CniError):
    """The network configuration is invalid; the message names the field."""

    code = Code.INVALID_CONFIG


class TryAgainError(CniError):
    """A transient failure (a store out of reach, a lock held too long)."""

    code = Code.TRY_AGAIN_LATER


class NotAvailableError(CniError):
    """STATUS: the plugin cannot serve ADD right now."""

    code = Code.NOT_AVAILABLE


class NetnsError(CniError):
    """CNI_NETNS is not usable."""

    code = Code.INVALID_ENV


class NetnsGoneError(NetnsError):
    """CNI_NETNS does not exist (any more)."""

    code = Code.UNKNOWN_CONTAINER


class InterfaceExistsError(CniError):
    """CNI_IFNAME already exists in the container."""

    code = Code.INTERFACE_EXISTS


class DeviceBusyError(CniError):
    """The device belongs to another attachment."""

    code = Code.DEVICE_BUSY


class KernelError(CniError):
    """The kernel refused a netlink request."""

    code = Code.NETLINK


class CheckError(CniError):
    """CHECK found the attachment differs from prevResult."""

    code = Code.CHECK_FAILED


class AddressTakenError(CniError):
    """A requested address is held by another attachment (the message names the holder)."""

    code = Code.ADDRESS_TAKEN


class ExhaustedError(CniError):
    """No free address left in a range."""

    code = Code.POOL_EXHAUSTED
