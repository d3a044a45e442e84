"""What an ADD killed between its reservation and its pool write left: found and freed by the next call
on that pool on the node (the retried ADD, or any other).

An ADD on a cluster store claims an address's reservation (OverlappingRangeIPReservation: POST) before
it writes the pool, two separate writes; killed between them (SIGKILL, an OOM kill of the process that
runs it), it leaves a reservation that no pool entry holds: the address is parked, never handed out
twice. Its retry cannot find it by asking the store without a list of every reservation (a call cannot
tell a retry from a first ADD, and a reservation's name is its address), and it would not always pick
that address again (lower ones freed meanwhile). So the one who knows is the node lock of the pool
(ipam.nodelock): every claim is noted in the lock file before its POST and the note is taken off when
the lock is released; a note found when the lock is taken is a dead holder's. The new holder frees the
reservation it names when the pool does not hold that address and the reservation still names the
noted attachment (compare-and-swap on its version: one taken over meanwhile stays). The killed ADD never
answered, so nobody uses the address: the retried ADD needs nothing of it, and allocates as any ADD.

Cost: on every claim one write to the lock file (a page-cache write, no fsync: a SIGKILL loses nothing
of it) and one truncation at the release; no request to the store. After a kill, the next holder reads
the pool and the reservation and deletes it: 3 requests, once.

Not covered: a node that goes down (its notes are of no use elsewhere), a holder killed while it
waited between two attempts (its claims are kept across attempts but noted only during one), a store
that serialises writers (the local store: one transaction, nothing left). There the reservation is
left to the attachment's DEL (which sweeps them), CNI GC and the reconciler, as before."""

from __future__ import annotations

from cni import jsonio, log
from cni.errors import CniError
from ipam.model import Allocation

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing would cost every call
if TYPE_CHECKING:
    from collections.abc import Callable

    from ipam.model import PoolView
    from ipam.nodelock import Held
    from ipam.reservations import Reservations


def note(lock: Held | None, name: str, offset: int, owner: Allocation) -> None:
    """Note in the held node lock that this holder claims reservation `name` (`offset`) for `owner`."""
    if lock is not None:
        lock.note(jsonio.dumps({"name": name, "offset": offset, "owner": list(owner)}))


def free(reservations: Reservations, read: Callable[[], PoolView], lock: Held) -> None:
    """Free what the notes found in `lock` (a dead holder's) name, judged on the pool `read` returns;
    those that cannot be judged now (the store did not answer) stay for the next holder."""
    left: list[bytes] = []
    view = None
    for line in lock.left:
        try:
            found = jsonio.loads(line, "node lock note")
            name, offset, owner = str(found["name"]), int(found["offset"]), Allocation(*found["owner"])
        except (CniError, KeyError, TypeError, ValueError):
            log.warning("node lock %s: note %r not understood: dropped", lock.path, line[:200])
            continue
        try:
            view = view or read()
            if view.holder(offset) is not None:
                continue  # written (killed after its pool write), or another entry's: never freed here
            log.info("reservation %s of %s/%s: its ADD died before its pool write: released", name,
                     owner.container_id, owner.ifname)  # fmt: skip
            reservations.release(name, owner.same_attachment)
        except CniError as e:
            log.warning("reservation %s of a killed ADD not released yet: %s", name, e)
            left.append(line)
    lock.left[:] = left
