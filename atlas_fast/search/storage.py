"""Where a study lives and how its processes know about each other: the storage (opened only after checks that
leave a foreign, locked or other study's storage untouched), each process's heartbeat in the trials it trains, and
the trials of dead processes, which another process takes over.

The heartbeat is a trial system attribute holding ``time.time()``, written by any storage Optuna has; a trial
whose heartbeat is older than the grace period belongs to a process that died (``kill -9``, a lost node).
"""

from __future__ import annotations

import json
import math
import re
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Sequence

from atlas_fast.errors import UsageError, short_repr

DEFINITION_ATTR = "atlas_fast:definition"  # the study's definition, stored as a study user attribute
HEARTBEAT_ATTR = "atlas_fast:heartbeat"  # a trial system attribute: time.time() of its owner's last sign of life
RELEASED = 0.0  # the heartbeat of a trial its process handed back (Ctrl-C): the next process takes it at once


def check_storage_url(url: str) -> None:
    """Refuse, in one line, a storage that is no URL (``--storage study.db``, the likeliest slip), before anything
    is planned: Optuna's storages are ``<dialect>://...`` URLs."""
    if not isinstance(url, str) or not re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", url):
        hint = f"sqlite:///{Path(url).expanduser().absolute()}" if isinstance(url, str) and url else \
            "sqlite:///path/to/study.db"
        raise UsageError(f"storage {short_repr(url)} is not a storage URL: give one such as {hint} (an SQLite file, "
                         f"made if missing) or a database's URL (postgresql://..., mysql://...).")


def open_storage(url: str, name: str, definition: dict[str, Any], lock_timeout: float):
    """The storage at ``url``, refused with one clear line if it is not an Optuna storage, is locked past
    ``lock_timeout`` seconds, or holds a study ``name`` of another ``definition``; nothing in it is changed before
    these checks pass."""
    import optuna
    import sqlalchemy.exc

    sqlite = url.startswith("sqlite:///")
    if sqlite:
        _check_sqlite_file(Path(url[len("sqlite:///"):]), lock_timeout)
    try:
        storage = optuna.storages.RDBStorage(url, engine_kwargs=_engine_kwargs(url, lock_timeout)) \
            if url.split(":", 1)[0].split("+")[0] in ("sqlite", "mysql", "postgresql") else \
            optuna.storages.get_storage(url)
        if sqlite:
            _fast_commits(storage.engine)
    except sqlalchemy.exc.OperationalError as exc:
        raise UsageError(f"storage {url}: {_sql_reason(exc)}") from None
    except (sqlalchemy.exc.DatabaseError, RuntimeError) as exc:
        raise UsageError(f"storage {url} is not an Optuna study storage ({str(exc).splitlines()[0]}).") from None
    except sqlalchemy.exc.ArgumentError as exc:  # a URL of no database SQLAlchemy knows
        raise UsageError(f"storage {url} is not a storage URL SQLAlchemy can open "
                         f"({str(exc).splitlines()[0]}).") from None
    definition = json.loads(json.dumps(definition, default=str))
    try:
        stored = {summary.study_name: summary for summary in optuna.study.get_all_study_summaries(storage)}
    except sqlalchemy.exc.OperationalError as exc:
        raise UsageError(f"storage {url}: {_sql_reason(exc)}") from None
    except (RecursionError, ValueError) as exc:  # a value stored in it that Optuna cannot parse back
        raise UsageError(f"storage {url} holds a damaged study (a stored value cannot be read: "
                         f"{type(exc).__name__}); nothing in it was changed. Give another --storage.") from None
    if name in stored:
        found = stored[name].user_attrs.get(DEFINITION_ATTR)
        if found is None:
            raise UsageError(f"storage {url} holds a study {name!r} that atlas_fast did not create; choose another "
                             f"--study-name.")
        if definition != found:
            different = sorted(k for k in set(found) | set(definition) if found.get(k) != definition.get(k))
            raise UsageError(f"storage {url} holds another study named {name!r} (it differs in "
                             f"{', '.join(different)}); give this one another --study-name, or repeat that study's "
                             f"options to resume it.")
    return storage


def close_storage(storage) -> None:
    """Close the database connections of ``storage`` (an Optuna storage, or a study on one) now, so an SQLite study's
    write-ahead log (:func:`_fast_commits`) is copied into its file when a search returns, not whenever its engine is
    freed. Reads through the study afterwards open new connections."""
    for inner in ("_storage", "_backend"):
        storage = getattr(storage, inner, storage)
    engine = getattr(storage, "engine", None)
    if engine is not None:
        engine.dispose()


def _engine_kwargs(url: str, timeout: float) -> dict[str, Any]:
    return {"connect_args": {"timeout": timeout}} if url.startswith("sqlite") else {}


def _sql_reason(exc: Exception) -> str:
    text = str(getattr(exc, "orig", exc))
    if "locked" in text:
        return "the database is locked by another process (held longer than the lock timeout); wait or free it."
    return text.splitlines()[0]


def _fast_commits(engine) -> None:
    """Write-ahead logging with ``synchronous=NORMAL``: a commit does not wait for the disk; a killed process loses
    nothing committed (only a power cut may lose the last commits), and readers do not block writers. The journal
    mode stays with the file; the synchronous setting is per connection, so the pool is emptied to reopen them."""
    import sqlalchemy

    def on_connect(connection, _record) -> None:
        connection.execute("PRAGMA synchronous=NORMAL")

    sqlalchemy.event.listen(engine, "connect", on_connect)
    engine.dispose()
    with engine.connect() as connection:
        connection.exec_driver_sql("PRAGMA journal_mode=WAL")


def _check_sqlite_file(path: Path, timeout: float) -> None:
    """An existing SQLite file must be an Optuna storage (or empty) and not held locked by another process (its
    write lock is taken and given back at once, within ``timeout``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.stat().st_size == 0:
        return
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=timeout) as db:
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        db.close()
        if tables:
            db = sqlite3.connect(path, timeout=timeout, isolation_level=None)
            try:
                db.execute("BEGIN IMMEDIATE")
                db.execute("ROLLBACK")
            finally:
                db.close()
    except sqlite3.OperationalError as exc:
        if "locked" in str(exc):
            raise UsageError(f"storage {path}: the database is locked by another process (held longer than the lock "
                             f"timeout, {timeout:g} s); wait or free it.") from None
        raise UsageError(f"storage {path} cannot be read as SQLite ({exc}).") from None
    except sqlite3.DatabaseError as exc:
        raise UsageError(f"storage {path} is not an SQLite database ({exc}); give another --storage.") from None
    if tables and not {"studies", "trials", "version_info"} <= tables:
        raise UsageError(f"storage {path} is an SQLite database of something else (tables: "
                         f"{', '.join(sorted(tables)[:5])}); give another --storage.")


class Heartbeat:
    """Writes the time into each live trial of this process every ``interval`` seconds, so that other processes
    know it is alive (and take a trial over once its owner has been silent for the grace period)."""

    def __init__(self, storage, interval: float) -> None:
        self.storage, self.interval = storage, interval
        self.trial_ids: set[int] = set()
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="atlas-fast-search-heartbeat", daemon=True)

    def beat(self, trial_id: int) -> None:
        self.storage.set_trial_system_attr(trial_id, HEARTBEAT_ATTR, time.time())

    def track(self, trial_ids: Sequence[int]) -> None:
        with self.lock:
            self.trial_ids = set(trial_ids)
        for trial_id in trial_ids:
            self.beat(trial_id)

    def _run(self) -> None:
        while not self.stopped.wait(self.interval):
            with self.lock:
                ids = list(self.trial_ids)
            for trial_id in ids:
                try:
                    self.beat(trial_id)
                except Exception:  # a finished trial, a busy database: the next beat tries again
                    pass

    def __enter__(self) -> "Heartbeat":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        self.thread.join()


def heartbeat_of(frozen) -> float:
    """When a running trial's process last showed life (its start, before the first beat)."""
    start = frozen.datetime_start.timestamp() if frozen.datetime_start else time.time()
    return float(frozen.system_attrs.get(HEARTBEAT_ATTR, start))


def wait_for_verdicts(study, heartbeat_seconds: float, grace_seconds: float) -> None:
    """Before asking anything, tell the running trials of live processes (their heartbeat moves) from those of dead
    ones (silent for the grace period), so that a resumed study trains its interrupted trials first, in order, as
    the uninterrupted study did; waits at most the grace period."""
    from optuna.trial import TrialState

    first_seen: dict[int, float] = {}
    while True:
        undecided = []
        for frozen in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            beat = heartbeat_of(frozen)
            seen = first_seen.setdefault(frozen.number, beat)
            if beat == seen and time.time() - beat < grace_seconds:
                undecided.append(frozen.number)
        if not undecided:
            return
        time.sleep(min(heartbeat_seconds / 2, 1.0))


def dead_trials(study, storage, study_id: int, grace_seconds: float, heartbeat: Heartbeat, limit: int) -> list:
    """Up to ``limit`` trials left running by a process that died (no heartbeat for ``grace_seconds``) or handed
    them back (:data:`RELEASED`), each claimed by this process and returned as ``(optuna Trial, seconds silent (inf:
    handed back), intermediate values)``, to be trained again from their start under their own numbers."""
    import optuna
    from optuna.trial import TrialState

    now = time.time()
    dead = []
    for frozen in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if len(dead) >= limit:
            break
        beat = heartbeat_of(frozen)
        silent = math.inf if beat == RELEASED else now - beat
        if silent < grace_seconds:
            continue
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, frozen.number)
        heartbeat.beat(trial_id)  # claimed: other processes now see it alive
        dead.append((optuna.trial.Trial(study, trial_id), silent, dict(frozen.intermediate_values)))
    return dead
