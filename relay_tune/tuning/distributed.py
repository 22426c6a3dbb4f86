"""Tuning on many machines: one PostgreSQL database holds the Optuna studies and the tuning records.

    relay-tune model.relay --trials 2000 --storage postgresql://tuner@db-host/tuning     # on every host

Every worker opens the same database. What each piece does:

- Records. `PostgresDatabase` keeps every `TuningRecord` in the table `relay_tune_records`, unique per
  (workload key, target, config key): a config is recorded once, whoever measured it, and a second insert of the
  same config is refused by the database itself (and logged as a `duplicate_measurement` event). A worker's own
  JSON-lines log is a mirror of what it measured. Reads are incremental (see `_refresh`).
- Claims. A config being measured has a row in `relay_tune_claims` (primary key: workload, target, config), so
  only one worker can claim it. The tuning loop's budget (`SharedBudget`) claims each round's proposals with one
  call of the server function `relay_tune_claim` (`PostgresDatabase.claim`).
- One budget. `relay_tune_claim` frees stale claims, counts the records plus the live claims of the model's tasks
  and inserts only as many claims as the budget has room for, under an advisory lock that the server holds for
  the length of that call (no worker code runs while it is held), so all workers together measure exactly
  `--trials` configs. Once the room left is smaller than the workers' rounds, a claim gets only its share of it
  (room / active workers), so the run's tail is short. A worker whose share is done but whose colleagues still
  hold claims waits for them: should one of them die, its claims come back to the pool and this worker measures
  in their place. `live_workers` reads who is measuring what from the claims (`relay-tune logs --storage`).
- Optuna. The xgb search claims directly and mirrors each measurement into the task's Optuna study afterwards
  (`StudyMirror`, for optuna-dashboard). The tpe and random searches ask their study first (each study's ask,
  check and claim under a per-study advisory lock, RUNNING trials with Optuna heartbeats), then claim as above.
- Crashes. Claims carry heartbeats, renewed by a background thread of the claiming process while the batch is
  built and timed (`ClaimBeats`). A worker killed with SIGKILL, or a host that disappears, stops beating; after
  the grace period the next claim deletes its claims (Optuna's stale RUNNING trials are failed with
  `optuna.storages.fail_stale_trials` and their configs enqueued again), so nothing is lost. A zombie that wakes
  up after its claim was given away finds its record refused: nothing is recorded twice.

Only the driver (psycopg 3, `pip install 'relay-tune[distributed]'`) is needed on the workers; the database
server is any PostgreSQL (12 or newer).
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import queue
import re
import socket
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from relay_tune.errors import RelayTuneError
from relay_tune.records.database import Database, MemoryDatabase, TaskTarget
from relay_tune.records.log_format import LogEntry, LogEvent, LogFormatError, LogWriter, TuningRecord, parse_line
from relay_tune.tuning.budget import BudgetFactory, Grant, Next, Proposer, TrialBudget
from relay_tune.tuning.progress import PhaseTimer
from relay_tune.tuning.workers import worker_identity

__all__ = [
    "DEFAULT_GRACE_PERIOD",
    "DEFAULT_HEARTBEAT_INTERVAL",
    "DistributedError",
    "PostgresDatabase",
    "SharedBudget",
    "StudyClaimLock",
    "advisory_lock",
    "is_database_url",
    "rdb_storage",
    "sqlalchemy_url",
]

# A claim's heartbeat is recorded every DEFAULT_HEARTBEAT_INTERVAL seconds; a claim whose last beat is older than
# the grace period belongs to a dead worker. The grace period must exceed the longest pause of the beating thread
# (a busy host, a long garbage collection), or a live claim is given away (harmless, the zombie's record is
# refused, but a measurement is wasted).
DEFAULT_HEARTBEAT_INTERVAL = 5
DEFAULT_GRACE_PERIOD = 30
# Rows committed this long after their insert statement began would be missed by the incremental read.
_VISIBILITY_WINDOW_S = 10.0

_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg")
_URL = re.compile(r"^(?P<scheme>[a-z0-9+]+)://(?P<rest>.*)$", re.IGNORECASE)


class DistributedError(RelayTuneError):
    """The database cannot be used: no driver installed, unreachable server, wrong credentials."""


def is_database_url(storage: object) -> bool:
    """True for a PostgreSQL URL (postgresql://, postgres://, postgresql+psycopg://)."""
    if not isinstance(storage, str):
        return False
    match = _URL.match(storage)
    return bool(match) and match.group("scheme").lower() in _SCHEMES  # type: ignore[union-attr]


def redact(url: str) -> str:
    """The URL without its password (for messages)."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)


def sqlalchemy_url(url: str) -> str:
    """The SQLAlchemy URL for `url` on the psycopg 3 driver; a clear error when that driver is not installed.

    SQLAlchemy reads a bare postgresql:// as psycopg2, which relay-tune does not use.
    """
    match = _URL.match(url)
    if not match or match.group("scheme").lower() not in _SCHEMES:
        raise DistributedError(f"not a PostgreSQL URL: {redact(url)}")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        raise DistributedError(
            "a postgresql:// storage needs the PostgreSQL driver psycopg 3, which is not installed; "
            "install it with: pip install 'relay-tune[distributed]'") from None
    return "postgresql+psycopg://" + match.group("rest")


# ---------------------------------------------------------------------------------------------------------------
# Connections, schema, locks
# ---------------------------------------------------------------------------------------------------------------

_ENGINES: dict[str, Any] = {}
_LOCK_CONNECTIONS: dict[str, Any] = {}
_LOCK_DEPTH: dict[tuple[str, int], int] = {}
_MUTEX = threading.RLock()


def _connection_error(url: str, err: Exception) -> DistributedError:
    first = str(getattr(err, "orig", err)).strip().splitlines()
    return DistributedError(f"cannot use the database {redact(url)}: {first[0] if first else type(err).__name__}")


def engine_for(url: str) -> Any:
    """One SQLAlchemy engine per URL and process (records, events, locks)."""
    # start-up: sqlalchemy and optuna take ~0.4 s to import; only a database storage needs them
    import sqlalchemy

    sa_url = sqlalchemy_url(url)
    with _MUTEX:
        if sa_url not in _ENGINES:
            engine = sqlalchemy.create_engine(sa_url, pool_pre_ping=True, pool_size=2, max_overflow=4)
            try:
                with engine.connect() as connection:
                    connection.execute(sqlalchemy.text("SELECT 1"))
            except sqlalchemy.exc.SQLAlchemyError as err:
                raise _connection_error(url, err) from None
            _ENGINES[sa_url] = engine
        return _ENGINES[sa_url]


def _lock_key(name: str) -> int:
    """A signed 64-bit advisory lock key for a name."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little", signed=True)


@contextlib.contextmanager
def advisory_lock(url: str, name: str) -> Iterator[None]:
    """Hold PostgreSQL's session advisory lock `name` (re-entrant within this process).

    The lock lives on one dedicated connection per process, so the server releases it when the process dies,
    whatever killed it.
    """
    # start-up: sqlalchemy and optuna take ~0.4 s to import; only a database storage needs them
    import sqlalchemy

    engine = engine_for(url)
    key = _lock_key(name)
    with _MUTEX:
        connection = _LOCK_CONNECTIONS.get(url)
        if connection is None or connection.closed:
            connection = _LOCK_CONNECTIONS[url] = engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        depth = _LOCK_DEPTH.get((url, key), 0)
        if depth == 0:
            connection.execute(sqlalchemy.text("SELECT pg_advisory_lock(:k)"), {"k": key})
        _LOCK_DEPTH[(url, key)] = depth + 1
        try:
            yield
        finally:
            _LOCK_DEPTH[(url, key)] -= 1
            if _LOCK_DEPTH[(url, key)] == 0:
                del _LOCK_DEPTH[(url, key)]
                connection.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:k)"), {"k": key})


_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS relay_tune_records (
        id BIGSERIAL PRIMARY KEY,
        workload_key TEXT NOT NULL,
        target TEXT NOT NULL,
        config_key TEXT NOT NULL,
        record TEXT NOT NULL,
        worker TEXT NOT NULL DEFAULT '',
        created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        UNIQUE (workload_key, target, config_key))""",
    "CREATE INDEX IF NOT EXISTS relay_tune_records_created ON relay_tune_records (created_at)",
    # A claim: `worker` measures this config now (done = false) or has recorded it (done = true). The primary key
    # makes a config claimable once; a claim whose beat is older than the grace period belongs to a dead worker
    # and is deleted by the next `relay_tune_claim`, which frees its config and its share of the budget.
    """CREATE TABLE IF NOT EXISTS relay_tune_claims (
        workload_key TEXT NOT NULL,
        target TEXT NOT NULL,
        config_key TEXT NOT NULL,
        worker TEXT NOT NULL,
        done BOOLEAN NOT NULL DEFAULT false,
        beat_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
        PRIMARY KEY (workload_key, target, config_key))""",
    # Counting the budget and claiming a round's configs, in one call: the budget lock is held inside the server
    # for the length of this function (about a millisecond), never while a worker's Python runs. Claims are
    # counted before records in one statement (one snapshot), so a claim finishing meanwhile is never missed.
    # Near the end of the budget the room left is shared out: a worker claims at most its share of it among the
    # workers active in the last p_active seconds (holding a live claim, or having recorded or claimed within
    # that window), so the last configs go to many workers at once instead of a few full rounds that leave the
    # others idle. (A second overload, beside the one of earlier versions, which workers of those still call.)
    """CREATE OR REPLACE FUNCTION relay_tune_claim(
        p_lock BIGINT, p_workloads TEXT[], p_targets TEXT[], p_total BIGINT, p_grace DOUBLE PRECISION,
        p_workload TEXT, p_target TEXT, p_keys TEXT[], p_worker TEXT, p_active DOUBLE PRECISION,
        OUT claimed TEXT[], OUT recorded BIGINT, OUT in_flight BIGINT) LANGUAGE plpgsql AS $$
    DECLARE
        room BIGINT;
        active BIGINT;
        k TEXT;
    BEGIN
        PERFORM pg_advisory_xact_lock(p_lock);
        DELETE FROM relay_tune_claims c USING unnest(p_workloads, p_targets) AS x(w, t)
            WHERE c.workload_key = x.w AND c.target = x.t AND NOT c.done
              AND c.beat_at < clock_timestamp() - make_interval(secs => p_grace);
        SELECT (SELECT count(*) FROM relay_tune_claims c JOIN unnest(p_workloads, p_targets) AS x(w, t)
                    ON c.workload_key = x.w AND c.target = x.t WHERE NOT c.done),
               (SELECT count(*) FROM relay_tune_records r JOIN unnest(p_workloads, p_targets) AS x(w, t)
                    ON r.workload_key = x.w AND r.target = x.t)
            INTO in_flight, recorded;
        room := p_total - recorded - in_flight;
        IF p_active > 0 AND room > 0 THEN
            SELECT count(*) INTO active FROM (
                SELECT c.worker FROM relay_tune_claims c JOIN unnest(p_workloads, p_targets) AS x(w, t)
                    ON c.workload_key = x.w AND c.target = x.t
                    WHERE NOT c.done OR c.beat_at >= clock_timestamp() - make_interval(secs => p_active)
                UNION SELECT p_worker) AS workers;
            room := least(room, greatest(1, ceil(room::numeric / active)::BIGINT));
        END IF;
        claimed := '{}';
        FOREACH k IN ARRAY p_keys LOOP
            EXIT WHEN room <= 0;
            CONTINUE WHEN EXISTS (SELECT 1 FROM relay_tune_records r WHERE r.workload_key = p_workload
                                  AND r.target = p_target AND r.config_key = k);
            INSERT INTO relay_tune_claims (workload_key, target, config_key, worker)
                VALUES (p_workload, p_target, k, p_worker) ON CONFLICT DO NOTHING;
            IF FOUND THEN
                claimed := claimed || k;
                room := room - 1;
            END IF;
        END LOOP;
    END $$""",
    """CREATE TABLE IF NOT EXISTS relay_tune_events (
        id BIGSERIAL PRIMARY KEY,
        session TEXT NOT NULL,
        event TEXT NOT NULL,
        entry TEXT NOT NULL,
        created_at TIMESTAMPTZ NOT NULL DEFAULT now())""",
)
_SCHEMA_READY: set[str] = set()


def ensure_schema(url: str) -> None:
    """Create relay-tune's tables and Optuna's (once per database; concurrent first workers take turns)."""
    # start-up: sqlalchemy and optuna take ~0.4 s to import; only a database storage needs them
    import sqlalchemy

    if url in _SCHEMA_READY:
        return
    engine = engine_for(url)
    with advisory_lock(url, "relay-tune:schema"):
        with engine.begin() as connection:
            for statement in _SCHEMA:
                connection.execute(sqlalchemy.text(statement))
        # Optuna creates its tables on first use; doing it under the lock avoids two first workers racing on
        # CREATE TABLE.
        _rdb(url, DEFAULT_HEARTBEAT_INTERVAL, DEFAULT_GRACE_PERIOD)
    _SCHEMA_READY.add(url)


# ---------------------------------------------------------------------------------------------------------------
# Optuna storage with heartbeats
# ---------------------------------------------------------------------------------------------------------------

_STORAGES: dict[tuple[str, int, int], Any] = {}


def _heartbeat_settings() -> tuple[int, int]:
    """Heartbeat interval and grace period in seconds; RELAY_TUNE_HEARTBEAT="INTERVAL,GRACE" overrides them."""
    text = os.environ.get("RELAY_TUNE_HEARTBEAT", "")
    if not text:
        return DEFAULT_HEARTBEAT_INTERVAL, DEFAULT_GRACE_PERIOD
    try:
        interval, grace = (int(part) for part in text.split(","))
    except ValueError:
        raise DistributedError(f"RELAY_TUNE_HEARTBEAT must be 'INTERVAL,GRACE' in whole seconds, got {text!r}") \
            from None
    if interval < 1 or grace <= interval:
        raise DistributedError("RELAY_TUNE_HEARTBEAT: need INTERVAL >= 1 and GRACE > INTERVAL")
    return interval, grace


def _rdb(url: str, interval: int, grace: int) -> Any:
    # start-up: sqlalchemy and optuna take ~0.4 s to import; only a database storage needs them
    import optuna
    import sqlalchemy

    key = (url, interval, grace)
    with _MUTEX:
        if key not in _STORAGES:
            # relay-tune beats the heartbeats itself (`Heartbeats`) for its ask/tell loop.
            warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                try:
                    rdb = optuna.storages.RDBStorage(
                        sqlalchemy_url(url), engine_kwargs={"pool_pre_ping": True, "pool_size": 2},
                        heartbeat_interval=interval, grace_period=grace,
                        heartbeat_stale_trial_callback=_return_to_pool)
                except sqlalchemy.exc.SQLAlchemyError as err:
                    raise _connection_error(url, err) from None
            # The cached wrapper keeps finished trials in memory and re-reads only the unfinished ones.
            _STORAGES[key] = optuna.storages.get_storage(rdb)
        return _STORAGES[key]


def rdb_storage(url: str) -> Any:
    """The Optuna storage of a PostgreSQL URL, with heartbeats (one per process and URL)."""
    ensure_schema(url)
    return _rdb(url, *_heartbeat_settings())


def _return_to_pool(study: Any, trial: Any) -> None:
    """A claim of a dead worker was failed: enqueue its config again, so the next ask measures it."""
    if "config_key" in trial.user_attrs and trial.params:
        study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number})


_LAST_STALE_CHECK: dict[tuple[int, int], float] = {}


def fail_stale_claims(study: Any, *, throttle: bool = True) -> None:
    """Fail the RUNNING trials of `study` whose heartbeat is older than the grace period (and re-enqueue them).

    Throttled to once per heartbeat interval per study and process: a claim cannot go stale faster than that, and
    the check runs under the claim locks, where every query makes other workers wait.
    """
    # start-up: sqlalchemy and optuna take ~0.4 s to import; only a database storage needs them
    import optuna

    storage = study._storage
    interval = storage.get_heartbeat_interval() if hasattr(storage, "get_heartbeat_interval") else None
    key = (id(storage), study._study_id)
    now = time.monotonic()
    if throttle and interval and now - _LAST_STALE_CHECK.get(key, -1e9) < interval:
        return
    _LAST_STALE_CHECK[key] = now
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


class StudyClaimLock:
    """The claim lock of studies in a PostgreSQL database (`relay_tune.tuning.search.ClaimLock`): a per-study
    advisory lock around each claim step, under which a dead worker's stale trials are failed first (their configs
    come back to the pool)."""

    def __init__(self, url: str) -> None:
        self.url = url

    @contextlib.contextmanager
    def hold(self, study: Any) -> Iterator[None]:
        with advisory_lock(self.url, f"relay-tune:claims:{study.study_name}"):
            fail_stale_claims(study)
            yield

    def close(self, study: Any) -> None:
        # The claim sweep is throttled to once per heartbeat interval; a session that ends right after taking a
        # dead worker's freed budget would otherwise leave that worker's stale trials RUNNING in the study.
        fail_stale_claims(study, throttle=False)


class Heartbeats:
    """A daemon thread recording the heartbeat of every trial this process holds, every `interval` seconds."""

    def __init__(self, storage: Any, interval: float) -> None:
        self.storage = storage
        self.interval = interval
        self._trials: set[int] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def hold(self, trial_id: int) -> None:
        self.storage.record_heartbeat(trial_id)  # at once: a claim without a beat is never considered stale
        with self._lock:
            self._trials.add(trial_id)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._beat, name="relay-tune-heartbeat", daemon=True)
                self._thread.start()

    def release(self, trial_id: int) -> None:
        with self._lock:
            self._trials.discard(trial_id)

    def _beat(self) -> None:
        while True:
            time.sleep(self.interval)
            with self._lock:
                held = sorted(self._trials)
            for trial_id in held:
                with contextlib.suppress(Exception):  # a finished trial or a lost connection: try again next time
                    self.storage.record_heartbeat(trial_id)


class StudyMirror:
    """A daemon thread adding finished trials to Optuna studies in the background (what optuna-dashboard shows).

    Written with plain SQL into Optuna's tables, one transaction per batch, the way Optuna's `add_trial` writes
    them (the study's row locked while trial numbers are counted); Optuna's own `add_trial` takes tens of ORM
    statements per trial, which on a busy host costs more CPU than the rest of a simulated worker together.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self._queue: queue.Queue[tuple[int, list[MirroredTrial]]] = queue.Queue()
        self._thread: threading.Thread | None = None

    def put(self, study_id: int, trials: list[MirroredTrial]) -> None:
        with _MUTEX:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._write, name="relay-tune-study-mirror", daemon=True)
                self._thread.start()
        self._queue.put((study_id, trials))

    def flush(self) -> None:
        """Wait until every trial put so far is written."""
        self._queue.join()

    def _write(self) -> None:
        while True:
            study_id, trials = self._queue.get()
            try:
                with contextlib.suppress(Exception):  # the mirror is a view: a lost write loses no record
                    write_trials(self.url, study_id, trials)
            finally:
                self._queue.task_done()


# A finished trial to mirror: {param: (Optuna's internal value, distribution JSON)}, value, user attributes.
MirroredTrial = tuple[dict[str, tuple[float, str]], float, dict[str, Any]]


def write_trials(url: str, study_id: int, trials: Sequence[MirroredTrial]) -> None:
    """Add COMPLETE trials to an Optuna study on `url` in one transaction."""
    # start-up: sqlalchemy and optuna take ~0.4 s to import; only a database storage needs them
    import sqlalchemy

    now = "(now() AT TIME ZONE 'UTC')"  # Optuna keeps naive UTC times
    with engine_for(url).begin() as connection:
        connection.execute(sqlalchemy.text("SELECT 1 FROM studies WHERE study_id = :s FOR UPDATE"), {"s": study_id})
        for params, value, attrs in trials:
            trial_id = connection.execute(sqlalchemy.text(
                "INSERT INTO trials (number, study_id, state, datetime_start, datetime_complete) "
                f"SELECT count(*), :s, 'COMPLETE', {now}, {now} FROM trials WHERE study_id = :s RETURNING trial_id"),
                {"s": study_id}).scalar_one()
            connection.execute(sqlalchemy.text(
                "INSERT INTO trial_values (trial_id, objective, value, value_type) VALUES (:t, 0, :v, 'FINITE')"),
                {"t": trial_id, "v": value})
            if params:
                connection.execute(sqlalchemy.text(
                    "INSERT INTO trial_params (trial_id, param_name, param_value, distribution_json) "
                    "VALUES (:t, :n, :v, :d)"),
                    [{"t": trial_id, "n": name, "v": internal, "d": dist} for name, (internal, dist) in params.items()])
            if attrs:
                connection.execute(sqlalchemy.text(
                    "INSERT INTO trial_user_attributes (trial_id, key, value_json) VALUES (:t, :k, :j)"),
                    [{"t": trial_id, "k": key, "j": json.dumps(v)} for key, v in attrs.items()])


_MIRROR: dict[str, StudyMirror] = {}


def study_mirror(url: str) -> StudyMirror:
    """The process's `StudyMirror` for a database."""
    with _MUTEX:
        if url not in _MIRROR:
            _MIRROR[url] = StudyMirror(url)
        return _MIRROR[url]


_HEARTBEATS: dict[int, Heartbeats] = {}


def heartbeats_for(storage: Any) -> Heartbeats | None:
    """The process's heartbeat thread for `storage` (None when the storage has no heartbeat)."""
    # start-up: sqlalchemy and optuna take ~0.4 s to import; only a database storage needs them
    from optuna.storages._heartbeat import BaseHeartbeat, is_heartbeat_enabled

    if not isinstance(storage, BaseHeartbeat) or not is_heartbeat_enabled(storage):
        return None
    with _MUTEX:
        if id(storage) not in _HEARTBEATS:
            _HEARTBEATS[id(storage)] = Heartbeats(storage, float(storage.get_heartbeat_interval() or 1))
        return _HEARTBEATS[id(storage)]


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


# ---------------------------------------------------------------------------------------------------------------
# Records in the database
# ---------------------------------------------------------------------------------------------------------------


class PostgresDatabase(Database):
    """Tuning records and log events in PostgreSQL (see the module docstring); `mirror`: this worker's JSONL log.

    Reads keep an in-memory index that each query tops up with the rows committed since the last one.
    """

    def __init__(self, url: str, mirror: str | os.PathLike[str] | None = None) -> None:
        ensure_schema(url)
        self.url = url
        self.engine = engine_for(url)
        self.mirror = LogWriter(mirror) if mirror is not None else None
        self.refused: dict[str, int] = {}  # why measurements of this process were not recorded -> how many
        self._memory = MemoryDatabase()
        self._seen: set[int] = set()
        self._max_id = 0
        self._since: Any = None  # database time of the previous read, minus the visibility window
        self._events_read = 0
        self._events: list[LogEvent] = []
        self.worker = worker_identity()  # host, pid and process start: a restarted worker is a new one
        self._claiming: set[TaskTarget] = set()  # tasks this worker claimed configs of
        interval, grace = _heartbeat_settings()
        # A claim's database beat and its Optuna trial's heartbeat come from two threads of the same cadence; a
        # stale claim is freed one interval after its trial counts as stale, so the worker that takes the freed
        # budget finds that trial stale too (and Optuna's sampler gets the config back, `_return_to_pool`).
        self.grace = grace + interval
        # A worker counts as active (for sharing out the last of the budget, `claim`) while it holds a live claim
        # or has claimed or recorded within two beats: a live worker records at least once per trial.
        self.active_window = 2.0 * interval
        self._beats = ClaimBeats(self, float(interval))

    # -- writing ---------------------------------------------------------------------------------------------

    def commit(self, record: TuningRecord) -> bool:
        """Insert the record; False (and an event saying why) when it is refused.

        A record of a task this worker claims configs of (`claim`) is only accepted while its claim on the config
        is still live: the claim is marked done in the insert's transaction, and that update finds nothing when the
        claim was deleted as stale (this worker stalled past the grace period and the config went back to the
        pool), or the budget would be overspent. The update locks the claim row, so a stale-claim sweep running
        meanwhile waits for this transaction and then finds the claim fresh. A config recorded already is refused
        by the unique key.
        """
        # start-up: sqlalchemy and optuna take ~0.4 s to import; only a database storage needs them
        import sqlalchemy

        claimed = (record.workload_key, record.target) in self._claiming
        refused = "duplicate_measurement"
        with self.engine.begin() as connection:
            live = True
            if claimed:
                live = connection.execute(sqlalchemy.text(
                    "UPDATE relay_tune_claims SET done = true, beat_at = clock_timestamp() WHERE workload_key = :w "
                    "AND target = :t AND config_key = :c AND worker = :k AND NOT done RETURNING 1"),
                    {"w": record.workload_key, "t": record.target, "c": record.config_key,
                     "k": self.worker}).first() is not None
                if not live:
                    refused = "claim_lost"
            row = None
            if live:
                row = connection.execute(sqlalchemy.text(
                    "INSERT INTO relay_tune_records (workload_key, target, config_key, record, worker) "
                    "VALUES (:w, :t, :c, :r, :k) ON CONFLICT (workload_key, target, config_key) DO NOTHING "
                    "RETURNING id"),
                    {"w": record.workload_key, "t": record.target, "c": record.config_key, "r": record.to_json(),
                     "k": worker_name()}).first()
            if claimed:
                self._beats.release((record.workload_key, record.target, record.config_key))
        if row is None:
            self.refused[refused] = self.refused.get(refused, 0) + 1
            self.log_event(LogEvent(refused, record.session, data={
                "workload_key": record.workload_key, "target": record.target, "config_key": record.config_key,
                "worker": worker_name()}))
            return False
        if self.mirror is not None:
            self.mirror.write_one(record)
        return True

    @property
    def duplicates(self) -> int:
        """Measurements of this process refused because their config had a record already."""
        return self.refused.get("duplicate_measurement", 0)

    def log_event(self, event: LogEvent) -> None:
        # start-up: sqlalchemy and optuna take ~0.4 s to import; only a database storage needs them
        import sqlalchemy

        with self.engine.begin() as connection:
            connection.execute(sqlalchemy.text(
                "INSERT INTO relay_tune_events (session, event, entry) VALUES (:s, :e, :j)"),
                {"s": event.session, "e": event.event, "j": event.to_json()})
        if self.mirror is not None:
            self.mirror.write_one(event)

    # -- reading ---------------------------------------------------------------------------------------------

    def _refresh(self) -> None:
        """Add the rows committed since the last read.

        Ids come from a sequence, and a row with a smaller id can commit after one with a larger id, so "id >
        the largest seen" alone could miss it for good. Each read therefore also re-reads the rows inserted in
        the last few seconds before the previous read (by the database clock) and skips those already seen.
        """
        # start-up: sqlalchemy and optuna take ~0.4 s to import; only a database storage needs them
        import sqlalchemy

        with self.engine.connect() as connection:
            if self._since is None:
                query = sqlalchemy.text("SELECT id, record, clock_timestamp() FROM relay_tune_records ORDER BY id")
                rows = connection.execute(query).all()
            else:
                query = sqlalchemy.text(
                    "SELECT id, record, clock_timestamp() FROM relay_tune_records "
                    "WHERE id > :m OR created_at >= :s ORDER BY id")
                rows = connection.execute(query, {"m": self._max_id, "s": self._since}).all()
            now = rows[-1][2] if rows else connection.execute(sqlalchemy.text("SELECT clock_timestamp()")).scalar()

        self._since = now - datetime.timedelta(seconds=_VISIBILITY_WINDOW_S)
        for row_id, text, _ in rows:
            if row_id in self._seen:
                continue
            self._seen.add(row_id)
            self._max_id = max(self._max_id, row_id)
            try:
                entry = parse_line(text)
            except LogFormatError:
                continue  # written by a newer relay-tune: not ours to read
            if isinstance(entry, TuningRecord):
                self._memory.commit(entry)

    def records(self, task_key: str, target: str) -> list[TuningRecord]:
        self._refresh()
        return self._memory.records(task_key, target)

    def all_records(self) -> list[TuningRecord]:
        """Every record, in commit order of this reader."""
        self._refresh()
        return [r for key in self._memory.keys() for r in self._memory.records(*key)]

    def keys(self) -> list[TaskTarget]:
        self._refresh()
        return self._memory.keys()

    @property
    def events(self) -> list[LogEvent]:
        # start-up: sqlalchemy and optuna take ~0.4 s to import; only a database storage needs them
        import sqlalchemy

        with self.engine.connect() as connection:
            rows = connection.execute(sqlalchemy.text(
                "SELECT id, entry FROM relay_tune_events WHERE id > :m ORDER BY id"), {"m": self._events_read}).all()
        for row_id, text in rows:
            self._events_read = max(self._events_read, row_id)
            with contextlib.suppress(LogFormatError):
                entry: LogEntry = parse_line(text)
                if isinstance(entry, LogEvent):
                    self._events.append(entry)
        return list(self._events)

    # -- the shared budget -----------------------------------------------------------------------------------

    def claim(self, tasks: Sequence[Any], total: int, task: Any, configs: Sequence[Any]) -> tuple[list[Any], int, int]:
        """Claim configs of `task` for this worker, as many as the budget `total` of `tasks` has room for.

        Returns the claimed configs (in the order given; those recorded or claimed by anyone else are left out),
        then the records and the live claims of `tasks` counted just before claiming. One call of the server
        function `relay_tune_claim`: stale claims are deleted, the budget is counted and the claims are inserted
        under one lock that the server holds for about a millisecond. Once the room left in the budget is smaller
        than the active workers' rounds, this worker gets at most its share of it (room / active workers, at
        least one), so the run's tail is short.
        """
        # start-up: sqlalchemy and optuna take ~0.4 s to import; only a database storage needs them
        import sqlalchemy

        names = sorted({(t.key, t.target) for t in tasks})
        lock = _lock_key("relay-tune:budget:" + hashlib.sha256(
            "\n".join(f"{w}|{t}" for w, t in names).encode()).hexdigest())
        keys = [c.key for c in configs]
        with self.engine.begin() as connection:
            claimed, recorded, in_flight = connection.execute(sqlalchemy.text(
                "SELECT * FROM relay_tune_claim(:l, :ws, :ts, :n, :g, :w, :t, :keys, :k, :a)"),
                {"l": lock, "ws": [w for w, _ in names], "ts": [t for _, t in names], "n": total,
                 "g": float(self.grace), "w": task.key, "t": task.target, "keys": keys, "k": self.worker,
                 "a": self.active_window}).one()
        self._claiming.add((task.key, task.target))
        taken = set(claimed or ())
        for key in taken:
            self._beats.hold((task.key, task.target, key))
        return [c for c in configs if c.key in taken], int(recorded), int(in_flight)

    def claimed_keys(self, task_key: str, target: str) -> set[str]:
        """Configs of this task claimed by any worker (being measured or recorded): a search skips them."""
        # start-up: sqlalchemy and optuna take ~0.4 s to import; only a database storage needs them
        import sqlalchemy

        with self.engine.connect() as connection:
            rows = connection.execute(sqlalchemy.text(
                "SELECT config_key FROM relay_tune_claims WHERE workload_key = :w AND target = :t"),
                {"w": task_key, "t": target}).all()
        return {key for (key,) in rows}

    def release_claims(self) -> None:
        """Give back this worker's claims not measured (an interrupted or finished session)."""
        # start-up: sqlalchemy and optuna take ~0.4 s to import; only a database storage needs them
        import sqlalchemy

        self._beats.clear()
        if not self._claiming:
            return
        with self.engine.begin() as connection:
            connection.execute(sqlalchemy.text(
                "DELETE FROM relay_tune_claims WHERE worker = :k AND NOT done"), {"k": self.worker})


class SharedBudget(TrialBudget):
    """One budget for every worker tuning into `database`: each round's proposals are claimed through
    `PostgresDatabase.claim`, which hands out only what the budget has room for, so all workers together measure
    exactly `total` configs. A worker whose share is claimed waits (re-checking every `wait_poll_s` seconds) while
    others still hold claims: should one of them die, its claims come back and this worker measures them.
    """

    def __init__(self, database: PostgresDatabase, tasks: Sequence[Any], total: int, spent: int,
                 wait_poll_s: float = 1.0) -> None:
        super().__init__(tasks, total, spent)
        self.database = database
        self.wait_poll_s = wait_poll_s
        self._full = False  # the budget was all claimed at the last look

    @classmethod
    def factory(cls, database: PostgresDatabase, wait_poll_s: float = 1.0) -> BudgetFactory:
        """Makes shared budgets on `database` (`tune`'s `budget`)."""
        return lambda tasks, total, spent: cls(database, tasks, total, spent, wait_poll_s)

    def exhausted(self, recorded: int) -> bool:
        return recorded >= self.total

    def grant(self, task: Any, search: Proposer, want: int, recorded: int, timer: PhaseTimer) -> Grant:
        if self._full:  # the last claim found the budget taken: look (cheaply) before proposing again
            waiting = self._wait_for_room(task, timer)
            if waiting is not None:
                return waiting
        with timer("search"):
            proposed = search.propose(want)
        with timer("storage", "claim"):
            configs, recorded, in_flight = self.database.claim(self.tasks, self.total, task, proposed)
        self.spent = recorded + in_flight
        self._full = self.spent + len(configs) >= self.total
        lost = [c for c in proposed if c not in configs]
        if lost:
            search.discard(lost)
        if recorded >= self.total:
            return Grant(Next.END)
        if proposed and not configs:
            return Grant(Next.RETRY)  # the budget is taken, or every proposal was claimed by another worker
        return Grant(Next.MEASURE, configs)

    def _wait_for_room(self, task: Any, timer: PhaseTimer) -> Grant | None:
        """None when the budget has room again; else what the loop does meanwhile."""
        with timer("storage"):
            _, recorded, in_flight = self.database.claim(self.tasks, self.total, task, [])
        if recorded >= self.total:
            return Grant(Next.END)
        if recorded + in_flight >= self.total:
            time.sleep(self.wait_poll_s)  # in case a worker holding claims dies
            return Grant(Next.RETRY)
        return None

    def close(self) -> None:
        self.database.release_claims()  # claims not measured go back to the pool at once


class ClaimBeats:
    """A daemon thread renewing the beat of this worker's live claims every `interval` seconds (one statement)."""

    def __init__(self, database: PostgresDatabase, interval: float) -> None:
        self.database = database
        self.interval = interval
        self._held: set[tuple[str, str, str]] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def hold(self, claim: tuple[str, str, str]) -> None:
        with self._lock:
            self._held.add(claim)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._beat, name="relay-tune-claim-beats", daemon=True)
                self._thread.start()

    def release(self, claim: tuple[str, str, str]) -> None:
        with self._lock:
            self._held.discard(claim)

    def clear(self) -> None:
        with self._lock:
            self._held.clear()

    def _beat(self) -> None:
        # start-up: sqlalchemy and optuna take ~0.4 s to import; only a database storage needs them
        import sqlalchemy

        while True:
            time.sleep(self.interval)
            with self._lock:
                if not self._held:
                    continue
            with contextlib.suppress(Exception):  # a lost connection: try again next time
                with self.database.engine.begin() as connection:
                    connection.execute(sqlalchemy.text(
                        "UPDATE relay_tune_claims SET beat_at = clock_timestamp() WHERE worker = :k AND NOT done"),
                        {"k": self.database.worker})


_STUDIES: dict[tuple[int, str], Any] = {}


def _study(storage: Any, name: str) -> Any:
    # start-up: sqlalchemy and optuna take ~0.4 s to import; only a database storage needs them
    import optuna

    key = (id(storage), name)
    if key not in _STUDIES:
        _STUDIES[key] = optuna.load_study(study_name=name, storage=storage)
    return _STUDIES[key]


def export_records(url: str, output: str | os.PathLike[str], events: bool = True) -> int:
    """Write every record of the database (and its log events) to a JSON-lines log; returns the record count.

    Lines are in time order, so the log reads like one written by a single process.
    """
    database = PostgresDatabase(url)
    entries: list[LogEntry] = list(database.all_records())
    count = len(entries)
    if events:
        entries += database.events
    entries.sort(key=lambda e: e.timestamp)
    path = Path(output)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for entry in entries:
            handle.write(entry.to_json() + "\n")
    return count


def live_workers(url: str) -> list[dict[str, Any]]:
    """The workers of the database that hold claims or were active within the grace period, from the claims table
    (whatever their search): worker identity, host, configs claimed and not yet recorded (`in_flight`), configs
    recorded under their claims, seconds since their last sign of life (a claim's heartbeat or a record), and
    whether their claims are stale (no beat for the grace period: a dead worker, whose claims the next claim of
    any worker frees). A worker that holds no claim and has recorded nothing for the grace period (one waiting
    for the last claims of others) is not listed."""
    # start-up: sqlalchemy and optuna take ~0.4 s to import; only a database storage needs them
    import sqlalchemy

    ensure_schema(url)
    interval, grace = _heartbeat_settings()
    window = float(grace + interval)  # as `PostgresDatabase.grace`
    with engine_for(url).connect() as connection:
        rows = connection.execute(sqlalchemy.text(
            "SELECT worker, count(*) FILTER (WHERE NOT done), count(*) FILTER (WHERE done), "
            "extract(epoch FROM clock_timestamp() - max(beat_at)), "
            "extract(epoch FROM clock_timestamp() - max(beat_at) FILTER (WHERE NOT done)) "
            "FROM relay_tune_claims GROUP BY worker "
            "HAVING bool_or(NOT done) OR max(beat_at) >= clock_timestamp() - make_interval(secs => :g) "
            "ORDER BY worker"), {"g": window}).all()
    workers = []
    for worker, in_flight, recorded, age, claim_age in rows:
        workers.append({"worker": worker, "host": worker.split(":", 1)[0], "in_flight": int(in_flight),
                        "recorded": int(recorded), "last_beat_s": float(age),
                        "stale": claim_age is not None and float(claim_age) > window})
    return workers


def study_overview(url: str) -> list[dict[str, Any]]:
    """Per Optuna study of relay-tune in the database: name and trials by state (who is measuring what:
    `live_workers`, from the claims, which every search makes)."""
    # start-up: sqlalchemy and optuna take ~0.4 s to import; only a database storage needs them
    import optuna

    storage = rdb_storage(url)
    overview = []
    for summary in optuna.study.get_all_study_summaries(storage, include_best_trial=False):
        study_id = storage.get_study_id_from_name(summary.study_name)
        states: dict[str, int] = {}
        for trial in storage.get_all_trials(study_id, deepcopy=False):
            states[trial.state.name] = states.get(trial.state.name, 0) + 1
        overview.append({"study": summary.study_name, "states": states})
    return overview
