"""Plugin processes of one node share pool writes: the cross-process counterpart of batch.Combiner.

Without the agent each CNI call is its own process, and concurrent calls on one node queue on the node
lock (ipam.nodelock), each then reading and writing the whole pool for one address. Here a call first
leaves its operations in the pool's queue directory beside the lock (`<lock>.q/`, a file per call) and
then waits for the lock as before. Whoever holds the lock takes every waiting call's operations into its
own batch, so one write serves them all, and leaves each call its outcome beside its request. A call
that gets the lock and finds its outcome returns without a request to the store.

- A request file is flock'ed by its caller from before it is visible until the caller is done: a
  request whose caller died (the kernel dropped its lock) is removed, never served.
- An outcome is written only after the write that decided it succeeded. A holder whose write failed
  answers nothing: the requests stay for the next holder (the caller itself, on its retry). Serving a
  request twice is harmless: the engine's decisions are idempotent per attachment.
- A caller withdraws its request only while it holds the node lock (its ops done by itself or by a
  holder, or on giving up): a request is never decided after its caller answered the runtime.
- Files are 0600 in a 0700 directory, written atomically (temporary name, then rename).
Nothing here is needed for correctness: when the directory cannot be used, calls run alone."""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os

from cni import jsonio, log
from cni.errors import CniError
from ipam import nodelock
from ipam.batch import DECIDED, FAILED, PENDING, WRITTEN, Claims, Op
from ipam.model import Allocation
from ipam.ranges import IPRange

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing would cost every call
if TYPE_CHECKING:
    from typing import Any

SUFFIX, OUTCOME = ".req", ".out"


class Ticket:
    """A call's published operations; `fd` holds the request's flock while the call lives."""

    def __init__(self, path: str, fd: int, ops: list[Op]) -> None:
        self.path, self.fd, self.ops = path, fd, ops
        self.closed = False
        # other calls' operations this call took as holder, by request: a retry after a failed write
        # takes the same objects again, so the reservations made for them are theirs (their outcome
        # hands them over, and the call drops those it did not end up with), never forgotten
        self.taken: dict[str, list[Op]] = {}

    def answered(self) -> bool:
        """Whether a holder decided this call's operations; if so they are updated and done."""
        try:
            with open(self.path[: -len(SUFFIX)] + OUTCOME, "rb") as f:
                outcome = jsonio.loads(f.read(), "outcome")
        except (OSError, ValueError):
            return False
        for op, out in zip(self.ops, outcome, strict=False):
            _settle(op, out)
        return all(op.done for op in self.ops)

    def close(self) -> None:
        """Withdraw the request. Under the node lock: no holder is then deciding it, and none will."""
        if self.closed:
            return
        self.closed = True
        for path in (self.path, self.path[: -len(SUFFIX)] + OUTCOME):
            with contextlib.suppress(OSError):
                os.unlink(path)
        os.close(self.fd)


def publish(lock_path: str, ops: list[Op]) -> Ticket | None:
    """Leave `ops` for the node's lock holders; None (logged) when the queue cannot be used."""
    directory = lock_path + ".q"
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        path = os.path.join(directory, f"{os.getpid()}-{os.urandom(6).hex()}{SUFFIX}")
        tmp = path + ".tmp"
        fd = nodelock.private(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except OSError as e:
        log.debug("node queue %s unavailable (%s): running alone", directory, e.strerror)
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # ours until we are done: before anyone can see the file
        os.write(fd, jsonio.dumps([_request(op) for op in ops]))
        os.rename(tmp, path)
    except OSError as e:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        log.debug("node queue %s unavailable (%s): running alone", directory, e.strerror)
        return None
    return Ticket(path, fd, ops)


class Taken:
    """Other calls' operations a holder took into its batch: answer() them once its write succeeded."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[Op]]] = []

    @property
    def ops(self) -> list[Op]:
        return [op for _, ops in self.calls for op in ops]

    def answer(self) -> None:
        for path, ops in self.calls:
            try:
                outcome = jsonio.dumps([_outcome(op) for op in ops])
                nodelock.write_private(path[: -len(SUFFIX)] + OUTCOME, outcome)
                os.unlink(path)  # answered: no later holder takes it again
            except OSError as e:
                log.debug("node queue: outcome for %s not left: %s", path, e.strerror)


def hand_back(taken: Taken) -> None:
    """After a failed write, under the lock: the reservations this holder made for the calls it took go
    back to them, in an outcome that leaves their operations undone (no holder takes them again): each
    call decides for itself when it gets the lock, preferring those addresses, and drops what it does
    not end up with. Without it a call that got the lock before the holder's retry would not know of
    them, and a reservation would be left without an allocation."""
    for path, ops in taken.calls:
        if not any(op.claims.created for op in ops) or not os.path.exists(path):
            continue
        undone = [{**_outcome(op), "done": False, "error": None, "offsets": [], "freed": [], "known": {},
                   "lost": 0} for op in ops]  # fmt: skip
        try:
            nodelock.write_private(path[: -len(SUFFIX)] + OUTCOME, jsonio.dumps(undone))
        except OSError as e:
            log.debug("node queue: reservations for %s not handed back: %s", path, e.strerror)


def take(ticket: Ticket | None, room: int) -> Taken:
    """The live requests waiting beside `ticket`'s (at most `room` operations), not yet answered."""
    taken = Taken()
    if ticket is None or room <= 0:
        return taken
    directory = os.path.dirname(ticket.path)
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(SUFFIX))
    except OSError:
        return taken
    for name in names:
        path = os.path.join(directory, name)
        if path == ticket.path or os.path.exists(path[: -len(SUFFIX)] + OUTCOME):
            continue
        ops = _load(path)
        if ops is None:
            continue
        if len(ops) > room:
            break
        if path in ticket.taken:  # taken before, by an attempt whose write failed: decided again
            ops = ticket.taken[path]
            for op in ops:
                if op.state != PENDING:
                    op.to(PENDING)
        ticket.taken[path] = ops
        taken.calls.append((path, ops))
        room -= len(ops)
    return taken


def _load(path: str) -> list[Op] | None:
    """A request's operations, if its caller is alive (else the file is removed)."""
    try:
        fd = nodelock.private(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:  # its caller holds it: alive
            with os.fdopen(os.dup(fd), "rb") as f:
                return [_op(r) for r in jsonio.loads(f.read(), path)]
        with contextlib.suppress(OSError):  # its caller is gone
            os.unlink(path)
        return None
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.debug("node queue: request %s skipped: %s", path, e)
        return None
    finally:
        os.close(fd)


# ---- the files' contents ----------------------------------------------------------------------------


def _request(op: Op) -> dict[str, Any]:
    r = op.rng
    return {"kind": op.kind, "owner": list(op.owner), "overlapping": op.overlapping, "want": op.want,
            "rng": {"network": str(r.network), "start": r.start, "end": r.end,
                    "excludes": [str(x) for x in r.excludes], "segments": [list(s) for s in r.segments],
                    "prefixlen": r.prefixlen, "pool": r.pool}}  # fmt: skip


def _op(doc: dict[str, Any]) -> Op:
    r = doc["rng"]
    rng = IPRange(
        ipaddress.ip_network(r["network"]), int(r["start"]), int(r["end"]),
        tuple(ipaddress.ip_network(x) for x in r["excludes"]),
        tuple((int(lo), int(hi)) for lo, hi in r["segments"]), int(r["prefixlen"]), str(r["pool"]),
    )  # fmt: skip
    want = doc.get("want")
    return Op(str(doc["kind"]), rng, Allocation(*map(str, doc["owner"])), bool(doc["overlapping"]),
              want=None if want is None else int(want))  # fmt: skip


def _outcome(op: Op) -> dict[str, Any]:
    c = op.claims
    error = None
    if op.error is not None:
        e = op.error
        error = ({"code": int(e.code), "msg": e.msg, "details": e.details} if isinstance(e, CniError)
                 else {"code": 999, "msg": str(e), "details": type(e).__name__})  # fmt: skip
    return {"done": op.done, "offsets": op.offsets, "freed": [[o, list(a)] for o, a in op.freed],
            "known": op.known, "error": error, "created": c.created, "mine": c.mine,
            "lost": c.lost}  # fmt: skip


def _settle(op: Op, out: dict[str, Any]) -> None:
    """Take a holder's outcome for `op` (the reservations it made join those this call made)."""
    op.offsets = [int(o) for o in out["offsets"]]
    op.freed = [(int(o), Allocation(*map(str, a))) for o, a in out["freed"]]
    op.known = {str(k): str(v) for k, v in out["known"].items()}
    claims: Claims = op.claims
    claims.created.update({str(k): str(v) for k, v in out["created"].items()})
    claims.mine.update({str(k): int(v) for k, v in out["mine"].items()})
    claims.lost += int(out["lost"])
    if not out["done"] or op.done:
        return
    if out["error"] is not None:
        e = out["error"]
        op.to(FAILED, CniError(str(e["msg"]), str(e["details"]), code=int(e["code"])))
        return
    if op.state == PENDING:
        op.to(DECIDED)
    op.to(WRITTEN)
