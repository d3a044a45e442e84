"""The embedded store: one SQLite file per node, safe under many concurrent plugin processes.

WAL journal (readers never block the writer), a busy timeout, every write one `BEGIN IMMEDIATE`
transaction that checks the object's version first (the compare-and-swap). Versions come from one
counter in the file, so a version is never reused (no ABA, even across delete/create).

synchronous=NORMAL: with WAL a commit survives any process crash and the file never corrupts; only
an OS crash or power loss can drop the last commits. That loses nothing that matters here: the store
is this node's own, and such a crash ends every sandbox on the node, so every attachment is ADDed
again afterwards (and a DEL for a forgotten one is success). FULL would add an fsync to every ADD.
The connection opens on first use: an unreadable path is StoreUnavailable (code 11) from the call
that needed it, never from construction."""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
import stat
import time
from collections.abc import Iterator

from ipam.config import StoreConfig
from ipam.model import Allocation, Pool, PoolUpdate, Reservation
from ipam.store.base import Conflict, Store, StoreUnavailable
from ipam.store.localview import OWNER, LocalView, num_of

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing would cost every call
if TYPE_CHECKING:
    from typing import Any

SCHEMA_VERSION = 1
BUSY_TIMEOUT = 10.0
PAGE = 200
MIN_FREE = 64 * 1024  # below this a failed write is reported as a full file system
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS counter (id INTEGER PRIMARY KEY CHECK (id = 1), value INTEGER NOT NULL);
INSERT OR IGNORE INTO counter VALUES (1, 0);
CREATE TABLE IF NOT EXISTS pools (name TEXT PRIMARY KEY, range TEXT NOT NULL, version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS allocations (
    pool TEXT NOT NULL, offset TEXT NOT NULL, num TEXT,
    container_id TEXT NOT NULL, podref TEXT NOT NULL, ifname TEXT NOT NULL,
    pod_uid TEXT NOT NULL, network TEXT NOT NULL, node TEXT NOT NULL,
    PRIMARY KEY (pool, offset)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS allocations_num ON allocations (pool, num);
CREATE INDEX IF NOT EXISTS allocations_owner ON allocations (pool, container_id, ifname);
CREATE INDEX IF NOT EXISTS allocations_pod ON allocations (pool, podref, ifname);
CREATE TABLE IF NOT EXISTS hints (pool TEXT NOT NULL, lo TEXT NOT NULL, next TEXT NOT NULL,
    PRIMARY KEY (pool, lo)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS reservations (
    name TEXT PRIMARY KEY, {OWNER.replace(",", " TEXT NOT NULL,")} TEXT NOT NULL, version INTEGER NOT NULL);
PRAGMA user_version = {SCHEMA_VERSION};
"""


def open_store(conf: StoreConfig) -> LocalStore:
    return LocalStore(conf.local_db)


class LocalStore(Store):
    serial = True  # exclusive(): one IMMEDIATE transaction per attempt

    def __init__(self, path: str, busy_timeout: float = BUSY_TIMEOUT) -> None:
        self.path = path
        self.busy_timeout = busy_timeout
        self._conn: sqlite3.Connection | None = None
        self._exclusive = False

    # ---- connection -------------------------------------------------------------------------------

    def _fail(self, e: sqlite3.Error | OSError) -> StoreUnavailable:
        text = e.strerror if isinstance(e, OSError) else str(e)
        return StoreUnavailable(f"local store {self.path}: {text}{self._file_system_state()}")

    def _file_system_state(self) -> str:
        """Why SQLite's 'disk I/O error' or 'unable to open' happened, when the file system says so."""
        where = os.path.dirname(os.path.abspath(self.path))
        while not os.path.isdir(where) and where != os.path.dirname(where):
            where = os.path.dirname(where)  # the directory may not exist yet: its nearest ancestor
        try:
            fs = os.statvfs(where)
        except OSError:
            return ""
        if fs.f_flag & os.ST_RDONLY:
            return " (the file system is read-only)"
        if fs.f_bavail * fs.f_frsize < MIN_FREE:
            return f" (the file system is full: {fs.f_bavail * fs.f_frsize} bytes free)"
        return ""

    def _connect(self) -> sqlite3.Connection:
        if self._conn is not None:
            return self._conn
        try:
            os.makedirs(os.path.dirname(self.path) or ".", mode=0o700, exist_ok=True)
            os.close(os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600))
            _refuse_symlinks(self.path)
        except OSError as e:
            if e.errno == errno.ELOOP:
                link = e.filename if isinstance(e.filename, str) else self.path
                raise StoreUnavailable(f"local store {link}: is a symlink; refusing to follow it") from None
            raise self._fail(e) from None
        deadline = time.monotonic() + self.busy_timeout
        while True:
            conn = None
            try:
                conn = sqlite3.connect(
                    self.path, timeout=self.busy_timeout, isolation_level=None, check_same_thread=False
                )
                conn.execute("PRAGMA synchronous = NORMAL")
                if conn.execute("PRAGMA user_version").fetchone()[0] != SCHEMA_VERSION:
                    _initialise(conn)
                break
            except sqlite3.Error as e:
                if conn is not None:
                    conn.close()
                # first users of a new database racing to switch it to WAL: SQLite can answer BUSY
                # there without waiting (the busy handler does not cover every lock step); try again
                if _busy(e) and time.monotonic() < deadline:
                    import random  # here only (a rare race): importing it would cost every call

                    time.sleep(0.005 + 0.02 * random.random())
                    continue
                raise self._error(e) from None
        self._conn = conn
        return conn

    def _error(self, e: sqlite3.Error) -> Exception:
        """SQLITE_BUSY/LOCKED after the busy timeout is contention (Conflict: retried under the
        engine's deadline); any other database error means the store is not usable (code 11)."""
        if _busy(e):
            return Conflict(f"local store {self.path}: busy")
        return self._fail(e)

    @contextlib.contextmanager
    def _tx(self, write: bool) -> Iterator[sqlite3.Connection]:
        """One transaction (IMMEDIATE for writes, so the busy timeout covers taking the write lock),
        or a part of the open `exclusive()` one."""
        conn = self._connect()
        if self._exclusive:
            try:
                yield conn
            except sqlite3.Error as e:
                raise self._error(e) from None
            return
        try:
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        except sqlite3.Error as e:
            raise self._error(e) from None
        try:
            yield conn
            conn.execute("COMMIT")
        except BaseException as e:
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            if isinstance(e, sqlite3.OperationalError | sqlite3.DatabaseError) and not isinstance(
                e, sqlite3.IntegrityError | sqlite3.ProgrammingError
            ):
                raise self._error(e) from None
            raise

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Optional fast path (see ipam.store.base): every call inside is one IMMEDIATE transaction,
        committed at the end, rolled back on any error. Writers on this node queue on SQLite's write
        lock instead of racing and retrying; the compare-and-swap checks still run inside."""
        conn = self._connect()
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as e:
            raise self._error(e) from None
        self._exclusive = True
        try:
            yield
            conn.execute("COMMIT")
        except BaseException as e:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            if isinstance(e, sqlite3.Error):
                raise self._error(e) from None
            raise
        finally:
            self._exclusive = False

    @staticmethod
    def _next_version(conn: sqlite3.Connection) -> int:
        row = conn.execute("UPDATE counter SET value = value + 1 WHERE id = 1 RETURNING value").fetchone()
        return int(row[0])

    # ---- pools ------------------------------------------------------------------------------------

    def get_pool(self, name: str) -> Pool | None:
        with self._tx(write=False) as conn:
            return _read_pool(conn, name)

    def commit_pool(self, pool: Pool, update: PoolUpdate) -> str:
        with self._tx(write=True) as conn:
            row = conn.execute("SELECT version FROM pools WHERE name = ?", (pool.name,)).fetchone()
            if (None if row is None else str(row[0])) != pool.version:
                raise Conflict(f"pool {pool.name}: changed since version {pool.version}")
            version = self._next_version(conn)
            if row is None:
                conn.execute("INSERT INTO pools VALUES (?, ?, ?)", (pool.name, pool.range, version))
            else:
                conn.execute("UPDATE pools SET version = ? WHERE name = ?", (version, pool.name))
            conn.executemany(
                "DELETE FROM allocations WHERE pool = ? AND offset = ?",
                [(pool.name, k) for k in update.remove],
            )
            for num in filter(None, map(num_of, update.remove)):  # hints stay lower bounds
                conn.execute(
                    "UPDATE hints SET next = ? WHERE pool = ? AND lo <= ? AND next > ?",
                    (num, pool.name, num, num),
                )
            conn.executemany(
                f"INSERT OR REPLACE INTO allocations (pool, offset, num, {OWNER}) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(pool.name, k, num_of(k), *a) for k, a in update.put.items()],
            )
            return str(version)

    def view_pool(self, name: str) -> LocalView | None:
        """A PoolView on the open exclusive() transaction (see ipam.store.base)."""
        if not self._exclusive:
            raise RuntimeError("view_pool is only valid inside exclusive()")
        with self._tx(write=False) as conn:
            row = conn.execute("SELECT range, version FROM pools WHERE name = ?", (name,)).fetchone()
            return None if row is None else LocalView(conn, name, row[0], str(row[1]))

    def iter_pools(self) -> Iterator[Pool]:
        for name in self._names("pools"):
            pool = self.get_pool(name)
            if pool is not None:
                yield pool

    def _names(self, table: str) -> Iterator[str]:
        last = ""
        while True:
            with self._tx(write=False) as conn:
                rows = conn.execute(
                    f"SELECT name FROM {table} WHERE name > ? ORDER BY name LIMIT ?", (last, PAGE)
                ).fetchall()
            yield from (r[0] for r in rows)
            if len(rows) < PAGE:
                return
            last = rows[-1][0]

    # ---- reservations -----------------------------------------------------------------------------

    def get_reservation(self, name: str) -> Reservation | None:
        with self._tx(write=False) as conn:
            return _read_reservation(conn, name)

    def put_reservation(self, res: Reservation) -> str:
        with self._tx(write=True) as conn:
            self._check_reservation(conn, res)
            version = self._next_version(conn)
            conn.execute(
                f"INSERT OR REPLACE INTO reservations (name, {OWNER}, version) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (res.name, *res.owner, version),
            )
            return str(version)

    def delete_reservation(self, res: Reservation) -> None:
        with self._tx(write=True) as conn:
            if _read_reservation(conn, res.name) is None:
                return
            self._check_reservation(conn, res)
            conn.execute("DELETE FROM reservations WHERE name = ?", (res.name,))

    @staticmethod
    def _check_reservation(conn: sqlite3.Connection, res: Reservation) -> None:
        row = conn.execute("SELECT version FROM reservations WHERE name = ?", (res.name,)).fetchone()
        if (None if row is None else str(row[0])) != res.version:
            raise Conflict(f"reservation {res.name}: changed since version {res.version}")

    def iter_reservations(self) -> Iterator[Reservation]:
        for name in self._names("reservations"):
            res = self.get_reservation(name)
            if res is not None:
                yield res

    # ---- health -----------------------------------------------------------------------------------

    def ping(self) -> None:
        with self._tx(write=False) as conn:
            conn.execute("SELECT 1 FROM pools LIMIT 1").fetchall()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _busy(e: sqlite3.Error) -> bool:
    return getattr(e, "sqlite_errorcode", None) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def _refuse_symlinks(path: str) -> None:
    """SQLite opens its -wal, -shm and -journal files following symlinks: one planted there would
    redirect its writes. They are created 0600 like the database (SQLite copies its mode)."""
    for suffix in ("-wal", "-shm", "-journal"):
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISLNK(os.lstat(path + suffix).st_mode):
                raise OSError(errno.ELOOP, "is a symlink", path + suffix)


def _initialise(conn: sqlite3.Connection) -> None:
    """Create the schema once; concurrent first users serialise on the write lock and re-check."""
    if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
        conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("BEGIN IMMEDIATE")
    try:
        if conn.execute("PRAGMA user_version").fetchone()[0] != SCHEMA_VERSION:
            for statement in SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _read_pool(conn: sqlite3.Connection, name: str) -> Pool | None:
    row = conn.execute("SELECT range, version FROM pools WHERE name = ?", (name,)).fetchone()
    if row is None:
        return None
    cur = conn.execute(f"SELECT offset, {OWNER} FROM allocations WHERE pool = ?", (name,))
    make = Allocation._make
    allocations = {r[0]: make(r[1:]) for r in cur}
    return Pool(name, row[0], allocations, str(row[1]))


def _read_reservation(conn: sqlite3.Connection, name: str) -> Reservation | None:
    row: Any = conn.execute(f"SELECT {OWNER}, version FROM reservations WHERE name = ?", (name,)).fetchone()
    if row is None:
        return None
    return Reservation(name, Allocation._make(row[:6]), str(row[6]))
