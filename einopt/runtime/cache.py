"""The measurement cache: side-by-side timings (and search results) kept in SQLite, so nothing is
timed or searched twice.

A timing is keyed by the canonical content of what was timed (both sides'
node groups, shapes, attributes and element types: :func:`einopt.runtime.graphkey.timing_key`)
and by what it depends on beyond that (ONNX Runtime's version, the CPU model,
the thread count: :func:`einopt.runtime.timing.environment_key`). A second
``optimize`` of the same model, or of another model with the same layers,
measures nothing new.

The default file is ``measurements.sqlite`` in the user's cache directory
(``~/.cache/einopt`` on Linux; ``EINOPT_CACHE_DIR`` overrides the directory).
Search results read from it become candidates, so a file einopt did not create,
or one others could have written (its folder's too), is not used: the run warns
and keeps its timings in memory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import sqlite3
import stat
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from einopt.runtime.timing import Comparison, environment_key

log = logging.getLogger(__name__)

SCHEMA = 1


def cache_dir() -> Path:
    """einopt's folder in the user's cache directory (``EINOPT_CACHE_DIR`` overrides it)."""
    env = os.environ.get("EINOPT_CACHE_DIR")
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_cache_dir("einopt"))


class CacheTrustError(RuntimeError):
    """A cache folder or file that others could have written: einopt refuses to read or run it."""


def private_dir(folder: Path) -> Path:
    """``folder``, created for this user only (mode 0700) if missing, after checking that nobody else
    can write into it: it must be owned by this user and not writable by its group or by others.

    einopt keeps native code and search results in its cache; a folder others can write is a place
    where they could plant a library einopt would load.

    Raises
    ------
    CacheTrustError
        When the folder (or what stands at its path) belongs to another user, is group- or
        world-writable, or is not a folder.
    """
    folder = Path(folder)
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = folder.stat()
    except OSError as e:
        raise CacheTrustError(f"cannot use the cache folder {folder}: {e.strerror or e}") from None
    check_private(folder, st, "folder")
    return folder


def cache_folder(*parts: str) -> Path:
    """The folder ``parts`` inside einopt's cache directory, each folder from the cache directory down
    checked (and created) by :func:`private_dir`: a private folder inside a shared one is no private
    place, since whoever can write the shared one can replace it.

    Raises
    ------
    CacheTrustError
        As :func:`private_dir`, for the first folder on the way that fails.
    """
    folder = private_dir(cache_dir())
    for part in parts:
        folder = private_dir(folder / part)
    return folder


def check_private(path: Path, st: os.stat_result, what: str = "file") -> None:
    """Raise :class:`CacheTrustError` unless ``st`` (``path``'s stat) is owned by this user and not
    writable by group or others (and, for ``what="folder"``, is a folder)."""
    if what == "folder" and not stat.S_ISDIR(st.st_mode):
        raise CacheTrustError(f"the cache folder {path} is not a folder")
    if st.st_uid != os.getuid():
        raise CacheTrustError(
            f"the cache {what} {path} belongs to another user (uid {st.st_uid}): einopt keeps native code "
            "there and only uses a cache of its own user; set EINOPT_CACHE_DIR to a folder of yours"
        )
    if st.st_mode & 0o022:
        raise CacheTrustError(
            f"the cache {what} {path} is writable by its group or by others (mode {st.st_mode & 0o777:o}): "
            f"einopt keeps native code and search results there; make it private (chmod go-w {path}) or set EINOPT_CACHE_DIR "
            "to a private folder"
        )


def _read_private(path: Path) -> bytes | None:
    """The bytes of the file at ``path``, None if there is none; read through one descriptor opened
    without following a symbolic link, after checking (on that descriptor) that the file is a regular
    file of this user's that nobody else can write.

    Raises
    ------
    CacheTrustError
        When it is a symbolic link or not a regular file, belongs to another user, or is group- or
        world-writable.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        if os.path.islink(path):
            raise CacheTrustError(f"the cache file {path} is a symbolic link") from None
        raise CacheTrustError(f"cannot read the cache file {path}: {e.strerror or e}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise CacheTrustError(f"the cache file {path} is not a regular file")
        check_private(path, st)
        return f.read()


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` (mode 0600) through a new file in the same folder renamed over it, so
    a concurrent reader sees the old file or the new one, whole."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_recorded(path: Path, record: Path, what: str) -> bytes | None:
    """The bytes of the file einopt built at ``path`` (see :func:`write_recorded`), or None: when there
    is none, or when it is refused (logged as "refused ``what`` ``path``: why; building it again"): a
    symbolic link, a file others own or can write, or bytes whose SHA-256 is not the one in ``record``.

    The file is read through one descriptor that was checked, so what is returned is what was checked:
    load it from these bytes, not from ``path``, and nothing can be swapped in between.
    """
    try:
        data = _read_private(path)
        recorded = None if data is None else _read_private(record)
    except CacheTrustError as e:
        log.warning("refused %s %s: %s; building it again", what, path, e)
        return None
    if data is None:
        return None
    if recorded is None or hashlib.sha256(data).hexdigest() != recorded.decode(errors="replace").strip():
        log.warning(
            "refused %s %s: its bytes are not the ones recorded when einopt built it; building it again",
            what,
            path,
        )
        return None
    return data


def write_recorded(path: Path, record: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` and its SHA-256 to ``record`` (each mode 0600, renamed into place, so
    a concurrent reader sees a whole file), for :func:`read_recorded`."""
    _write_private(path, data)
    _write_private(record, hashlib.sha256(data).hexdigest().encode())


def default_path() -> Path:
    """Where the cache lives unless told otherwise."""
    return cache_dir() / "measurements.sqlite"


def resolve_path(cache: bool | str | Path | None) -> Path | None:
    """The file an ``Options.cache`` value names: True the default, False/None none, else the path."""
    if cache is True:
        return default_path()
    if cache is False or cache is None:
        return None
    return Path(cache)


@dataclasses.dataclass
class Stats:
    """What the cache did during one run."""

    hits: int = 0
    measured: int = 0


class MeasurementCache:
    """Side-by-side timings by key, in an SQLite file (``path=None``: in memory, for one run only).

    Parameters
    ----------
    path : path or None
        The database file (created with its directory); None keeps timings
        for this process only (``--no-cache``).
    """

    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path is not None else None
        self.stats = Stats()
        self._memory: dict[str, Comparison] = {}
        self._searches: dict[str, dict] = {}
        self._values: dict[str, dict] = {}
        self._db: sqlite3.Connection | None = None
        if self.path is not None:
            self._db = self._open(self.path)
        self.usable = self._db is not None
        self._environment: dict[str, object] | None = None  # read once: /proc/cpuinfo, ORT, threads

    @staticmethod
    def _open(path: Path) -> sqlite3.Connection | None:
        """The database at ``path``, made ready; None (after one warning saying why) when it cannot be
        used or is not to be trusted: search results read from it become candidates."""
        try:
            private_dir(path.parent)
            new = _claim_file(path)
            db = sqlite3.connect(path, timeout=30)
            try:
                if not new:
                    _check_ours(db, path)
                _prepare(db)
            except BaseException:
                db.close()
                raise
            return db
        except CacheTrustError as e:
            log.warning("measurement cache refused: %s; timings are kept for this run only", e)
        except (sqlite3.Error, OSError) as e:
            log.warning("measurement cache %s unusable (%s): timings are kept for this run only", path, e)
        return None

    def key(self, before: str, after: str) -> str:
        """The key of timing ``after`` against ``before`` (two :func:`einopt.runtime.graphkey.timing_key` s) here."""
        if self._environment is None:
            self._environment = environment_key()
        text = json.dumps([before, after, self._environment], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()

    def get(self, key: str) -> Comparison | None:
        if key in self._memory:
            return self._memory[key]
        if self._db is None:
            return None
        row = self._db.execute("SELECT value FROM comparisons WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        c = Comparison.from_stored(json.loads(row[0]), cached=True)
        self._memory[key] = c
        return c

    def put(self, key: str, c: Comparison, what: str = "") -> None:
        self._memory[key] = dataclasses.replace(c, cached=True)
        if self._db is None:
            return
        self._write(
            "INSERT OR REPLACE INTO comparisons VALUES (?, ?, ?, ?)",
            (key, what, json.dumps(c.stored()), time.time()),
        )

    def measure(
        self, key: str, what: str, timer: Callable[[], Comparison], fresh: bool = False
    ) -> Comparison:
        """The cached comparison under ``key``, or ``timer()``'s (then cached; ``fresh``: always time)."""
        found = None if fresh else self.get(key)
        if found is not None:
            self.stats.hits += 1
            return found
        c = timer()
        self.stats.measured += 1
        self.put(key, c, what)
        return c

    def found(self, key: str) -> dict | None:
        """A search's results stored under ``key`` (see :mod:`einopt.stages.partsearch`), or None."""
        return self._lookup("searches", self._searches, key)

    def keep(self, key: str, value: dict) -> None:
        """Store a search's results (JSON-serialisable) under ``key``."""
        self._searches[key] = value
        self._write("INSERT OR REPLACE INTO searches VALUES (?, ?, ?)", (key, json.dumps(value), time.time()))

    def value(self, key: str) -> dict | None:
        """A measurement other than a comparison (a node's time, the calibration) stored under ``key``."""
        return self._lookup("measured", self._values, key)

    def remember(self, key: str, what: str, value: dict) -> None:
        """Store a measurement (JSON-serialisable) under ``key`` (see :meth:`key`)."""
        self._values[key] = value
        self._write(
            "INSERT OR REPLACE INTO measured VALUES (?, ?, ?, ?)", (key, what, json.dumps(value), time.time())
        )

    def _lookup(self, table: str, memo: dict[str, dict], key: str) -> dict | None:
        """The JSON value under ``key`` in ``table`` (``searches`` or ``measured``), memoised."""
        if key in memo:
            return memo[key]
        if self._db is None:
            return None
        row = self._db.execute(f"SELECT value FROM {table} WHERE key = ?", (key,)).fetchone()
        return None if row is None else memo.setdefault(key, json.loads(row[0]))

    def _write(self, sql: str, params: tuple) -> None:
        """Run one insert and commit; a full disk or a locked file must not sink the run."""
        if self._db is None:
            return
        try:
            self._db.execute(sql, params)
            self._db.commit()
        except sqlite3.Error as e:
            log.warning("cannot write to the measurement cache %s: %s", self.path, e)

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def describe(self) -> dict:
        return {
            "path": str(self.path) if self.usable else None,
            "hits": self.stats.hits,
            "measured": self.stats.measured,
        }


CREATOR = "einopt"
"""The ``creator`` row of a cache's ``meta`` table: the file is one einopt made."""


def _claim_file(path: Path) -> bool:
    """Whether the cache file at ``path`` is new: created here, readable and writable by this user only.

    An existing file must be a regular file (not a symbolic link, which could point anywhere) owned by
    this user and not writable by group or others; it is checked before SQLite opens it.

    Raises
    ------
    CacheTrustError
        When the existing file is a link, not a regular file, or not private.
    """
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:  # also a symbolic link, dangling or not: O_EXCL does not follow it
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            raise CacheTrustError(
                f"the cache file {path} is a symbolic link: einopt only opens a cache file of its own"
            ) from None
        if not stat.S_ISREG(st.st_mode):
            raise CacheTrustError(f"the cache file {path} is not a regular file") from None
        check_private(path, st, "file")
        return False
    os.close(fd)
    return True


def _check_ours(db: sqlite3.Connection, path: Path) -> None:
    """Raise :class:`CacheTrustError` unless ``db`` is a cache einopt created (its ``meta`` table with a
    ``schema`` row, and no other creator): einopt writes and drops tables in it, and reads search
    results from it."""
    refuse = (
        f"{path} is not a measurement cache einopt created; remove it or choose another cache file (--cache)"
    )
    try:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.OperationalError:  # locked, unreadable: not a verdict on the file
        raise
    except sqlite3.DatabaseError as e:  # "file is not a database"
        raise CacheTrustError(f"{refuse} ({e})") from None
    if "meta" not in tables:
        raise CacheTrustError(refuse)
    rows = dict(db.execute("SELECT name, value FROM meta WHERE name IN ('schema', 'creator')").fetchall())
    # caches made before the creator row carry only the schema row
    if "schema" not in rows or rows.get("creator", CREATOR) != CREATOR:
        raise CacheTrustError(refuse)


def _prepare(db: sqlite3.Connection) -> None:
    """Create what is missing; a schema change drops the timings (their format changed)."""
    db.execute("CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT)")
    row = db.execute("SELECT value FROM meta WHERE name = 'schema'").fetchone()
    if row is not None and int(row[0]) != SCHEMA:
        db.execute("DROP TABLE IF EXISTS comparisons")
    db.execute("INSERT OR REPLACE INTO meta VALUES ('schema', ?)", (str(SCHEMA),))
    db.execute("INSERT OR IGNORE INTO meta VALUES ('creator', ?)", (CREATOR,))
    db.execute(
        "CREATE TABLE IF NOT EXISTS comparisons ("
        "key TEXT PRIMARY KEY, what TEXT, value TEXT NOT NULL, created REAL NOT NULL)"
    )
    db.execute(
        "CREATE TABLE IF NOT EXISTS searches (key TEXT PRIMARY KEY, value TEXT NOT NULL, created REAL NOT NULL)"
    )
    db.execute(
        "CREATE TABLE IF NOT EXISTS measured ("
        "key TEXT PRIMARY KEY, what TEXT, value TEXT NOT NULL, created REAL NOT NULL)"
    )
    db.commit()
