"""The plain execution mode: a plugin process without the agent, one call's ops per batch.

node lock -> read (or the node's snapshot) -> decide -> compare-and-swap -> retry (ipam.attempt). On a
cluster store the call also publishes its ops in the node's queue (ipam.nodequeue): whoever holds the
node lock takes the queued ops of the node's other plugin processes into its batch, writes them with
its own and answers them; a call that gets the lock after another holder decided its ops is done
without a request. Why plugin processes keep this machinery though the agent does without it:
docs/architecture.md. The DEL's reservations are released by the caller after the batch
(Engine.delete)."""

from __future__ import annotations

import time

from cni import log
from cni.errors import CniError
from ipam import batch, nodelock, nodequeue
from ipam.attempt import Attempt, Mode
from ipam.batch import Op
from ipam.model import Allocation

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ipam.engine import Engine


def run(engine: Engine, ops: list[Op]) -> None:
    """Run the ops of one range (one pool) to completion; each op's error is left on it."""
    name = engine.pool_name(ops[0].rng)
    ticket = path = None
    if engine.lock_dir:  # share writes with the node's other plugin processes
        path = nodelock.path_for(engine.lock_dir, engine.identity, ops[0].owner.node, name)
        ticket = nodequeue.publish(path, ops)
    try:
        batch.combiner((engine.identity, name)).run(ops, lambda group: attempt(engine, name, group, ticket))
    finally:
        if ticket is not None and path is not None and not ticket.closed:
            _withdraw(ticket, path)  # giving up: a holder may have decided it meanwhile


def attempt(engine: Engine, name: str, ops: list[Op], ticket: nodequeue.Ticket | None) -> None:
    """The batch `ops` of pool `name`, attempted until written; `ticket`: its ops in the node's queue."""
    Attempt(engine, name, ops, Plain(engine, ticket)).run()


class Plain(Mode):
    """The node queue's part in an attempt (ipam.attempt.Mode)."""

    def __init__(self, engine: Engine, ticket: nodequeue.Ticket | None) -> None:
        self.e, self.ticket = engine, ticket
        self.taken = nodequeue.Taken()

    def enter(self, lock: nodelock.Held | None, pending: int) -> list[Op] | None:
        """Under the node lock: None when another holder decided this call's ops already (its request
        withdrawn); else, after pacing its write, the ops of the node's other calls it takes into its
        batch. Without a ticket nothing to take. Without the lock (its holder is a stopped process:
        ipam.nodelock) the call withdraws its request at once, taking an outcome a holder left before,
        if any: no holder can serve it while the lock is held by the stopped one."""
        ticket = self.ticket
        self.taken = nodequeue.Taken()
        if ticket is None:
            return []
        if lock is None:
            done = ticket.answered()
            ticket.close()
            return None if done else []
        if ticket.answered():
            ticket.close()
            return None
        _pace(lock)
        self.taken = nodequeue.take(ticket, batch.MAX_BATCH - pending)
        for op in self.taken.ops:
            op.started = op.begun = self.e.retry.clock()
        return list(self.taken.ops)

    def done(self, lock: nodelock.Held | None, decided: list[Op]) -> None:
        """After the write: the other calls' ops answered, this call's request withdrawn (under the
        lock: no holder takes it after this)."""
        if lock is not None and self.ticket is not None:
            _remember(self.e, lock, decided)
        self.taken.answer()
        if lock is not None and self.ticket is not None and all(op.done for op in self.ticket.ops):
            self.ticket.close()

    def failed(self) -> None:
        nodequeue.hand_back(self.taken)


def _remember(engine: Engine, lock: nodelock.Held, decided: list[Op]) -> None:
    """Keep beside the node lock the reservations this write's ADDs created (their versions), and hand
    each DEL the versions of the reservations it freed: its process deletes them with that version as a
    precondition instead of reading them first (a plugin process knows nothing of the ADD's process).
    Only a hint: a reservation changed since is a Conflict, then read."""
    if not any(op.overlapping for op in decided):
        return
    known = lock.reservations()
    changed = False
    for op in decided:
        if not op.overlapping:
            continue
        if op.kind == "add":
            res = engine.reservation_name(op.rng, op.offsets[0])
            if res in op.claims.created:
                known[res] = [op.claims.created[res], *op.owner]
                changed = True
            continue
        for offset, held in op.freed:
            res = engine.reservation_name(op.rng, offset)
            entry = known.pop(res, None)
            changed = changed or entry is not None
            whole = isinstance(entry, list) and len(entry) == 7
            if entry and whole and Allocation(*map(str, entry[1:])).same_attachment(held):
                op.known[res] = str(entry[0])
    if changed:
        lock.keep_reservations(known)


def _pace(lock: nodelock.Held) -> None:
    """A plugin process holding the node lock waits as the agent's combiner does (batch.PACE): the
    node's calls that arrive meanwhile queue behind the lock and join this write (ipam.nodequeue)."""
    gap = batch.pace_gap(*lock.last_write())
    if gap > 0:
        time.sleep(gap)


def _withdraw(ticket: nodequeue.Ticket, path: str) -> None:
    """Withdraw a request under the node lock, taking the outcome a holder left for it, if any."""
    try:
        with nodelock.held(path) as lock:
            if lock is not None:
                ticket.answered()
            ticket.close()
    except CniError as e:  # a hung holder: the call's own error is what it answers
        log.warning("node queue: request withdrawn without the lock: %s", e)
    finally:
        ticket.close()
