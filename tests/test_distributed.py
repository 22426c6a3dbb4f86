"""Tuning on many machines against a real PostgreSQL server: one budget, claims with heartbeats, records in the
database, the host-wide measurement lock, and the commands that read a study (logs, export, plot, build).

The server: `$RELAY_TUNE_TEST_POSTGRES` (an admin URL, e.g. postgresql://postgres@/postgres?host=/tmp/pg&port=5432,
as `.ci/run` exports), or else a throwaway cluster this module starts with the PostgreSQL binaries it finds
(initdb, pg_ctl; as the `postgres` user when running as root). Each test gets a database of its own.
"""

from __future__ import annotations

import glob
import itertools
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from model_sources import write_tiny_cnn

from relay_tune.tuning import read_records

REPO_ROOT = Path(__file__).resolve().parents[1]
ENV_VAR = "RELAY_TUNE_TEST_POSTGRES"



# ---------------------------------------------------------------------------------------------------------------
# The server
# ---------------------------------------------------------------------------------------------------------------


def _postgres_bindir() -> Path | None:
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True)
    return Path(candidates[0]).parent if candidates else None


def _as_server_user(command: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: run it as the unprivileged `postgres` user then."""
    if os.geteuid() != 0:
        return command
    return ["runuser", "-u", "postgres", "--", *command]


@pytest.fixture(scope="session")
def postgres_admin_url() -> Iterator[str]:
    pytest.importorskip("psycopg", reason="the PostgreSQL driver psycopg 3 is not installed "
                        "(pip install 'relay-tune[distributed]')")
    if os.environ.get(ENV_VAR):
        yield os.environ[ENV_VAR]
        return
    bindir = _postgres_bindir()
    if bindir is None:
        pytest.skip(f"PostgreSQL is not installed (no initdb found) and ${ENV_VAR} is not set")
    folder = Path(tempfile.mkdtemp(prefix="relay-tune-pg-"))
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres", "postgres")
    data = folder / "data"
    with socket.socket() as probe:  # a port number no other local server uses (it names the unix socket)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    subprocess.run(_as_server_user([str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres",
                                    "--no-sync"]), check=True, capture_output=True)
    options = f"-k {folder} -p {port} -c listen_addresses='' -c max_connections=200 -c fsync=off"
    subprocess.run(_as_server_user([str(bindir / "pg_ctl"), "-D", str(data), "-l", str(folder / "server.log"),
                                    "-o", options, "-w", "start"]), check=True, capture_output=True)
    try:
        yield f"postgresql://postgres@/postgres?host={folder}&port={port}"
    finally:
        subprocess.run(_as_server_user([str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"]),
                       capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture()
def pg_url(postgres_admin_url: str) -> Iterator[str]:
    """A fresh, empty database on the test server."""
    import psycopg

    name = f"relay_tune_test_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(postgres_admin_url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    head, _, query = postgres_admin_url.partition("?")
    yield head.rsplit("/", 1)[0] + "/" + name + (f"?{query}" if query else "")
    with psycopg.connect(postgres_admin_url, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), COLUMNS="400", **extra)
    env.pop("RELAY_TUNE_MEASURE_LOCK", None)
    return env


def _sql(url: str, query: str) -> list[tuple]:
    import psycopg

    with psycopg.connect(url) as connection:
        return connection.execute(query).fetchall()


def _simulated_worker(url: str, log: Path, trials: int, seconds: float, *, host: str | None = None,
                      env: dict[str, str] | None = None, search: str = "tpe") -> subprocess.Popen[str]:
    """A simulated worker process (`relay_tune.tuning.simulated`); `host`: pretend to run on another machine."""
    prelude = f"import socket; socket.gethostname = lambda: {host!r}; " if host else ""
    code = (prelude + "import sys; from relay_tune.tuning.simulated import main; sys.exit(main(sys.argv[1:]))")
    return subprocess.Popen(
        [sys.executable, "-c", code, "--storage", url, "--trials", str(trials), "--log", str(log),
         "--seconds", str(seconds), "--search", search],
        env=env or _env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


# ---------------------------------------------------------------------------------------------------------------
# Without a server
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture()
def model_file(tmp_path: Path) -> Path:
    return write_tiny_cnn(tmp_path)


def test_without_the_driver_one_clear_message(model_file: Path, tmp_path: Path) -> None:
    code = ("import sys; sys.modules['psycopg'] = None; from relay_tune.cli import main; "
            "sys.exit(main(sys.argv[1:]))")
    for args in ([str(model_file), "--trials", "2", "--storage", "postgresql://tuner@db.invalid/tuning",
                  "--log", str(tmp_path / "x.jsonl")],
                 ["logs", "--storage", "postgresql://tuner@db.invalid/tuning"]):
        done = subprocess.run([sys.executable, "-c", code, *args], env=_env(), capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 1, done.stderr
        assert "Traceback" not in done.stderr
        assert "pip install 'relay-tune[distributed]'" in done.stderr


def test_an_unreachable_server_is_one_clear_message(model_file: Path, tmp_path: Path) -> None:
    pytest.importorskip("psycopg")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nobody listens there
    url = f"postgresql://tuner:secret@127.0.0.1:{port}/tuning"
    done = subprocess.run([sys.executable, "-m", "relay_tune", "logs", "--storage", url], env=_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "cannot use the database" in done.stderr and "secret" not in done.stderr  # the password is not shown


# ---------------------------------------------------------------------------------------------------------------
# One budget, claims, heartbeats
# ---------------------------------------------------------------------------------------------------------------


def test_workers_share_one_budget_exactly(pg_url: str, tmp_path: Path) -> None:
    workers = [_simulated_worker(pg_url, tmp_path / f"w{i}.jsonl", 30, 0.05) for i in range(3)]
    reports = []
    for worker in workers:
        out, err = worker.communicate(timeout=240)
        assert worker.returncode == 0, err
        reports.append(json.loads(out.strip().splitlines()[-1]))
    assert sum(r["measured"] for r in reports) == 30  # together, not 30 each
    assert all(r["duplicates"] == 0 for r in reports)
    assert _sql(pg_url, "SELECT count(*), count(DISTINCT (workload_key, target, config_key)) "
                        "FROM relay_tune_records") == [(30, 30)]
    mirrored = [r for i in range(3) for r in read_records(tmp_path / f"w{i}.jsonl")]
    assert len(mirrored) == 30  # each local log mirrors what its worker measured
    assert max(Counter((r.workload_key, r.config_key) for r in mirrored).values()) == 1


def test_the_last_of_the_budget_is_shared_among_the_active_workers(pg_url: str) -> None:
    """While the budget has room for every active worker's round, a claim gets all it asks for; near the end it
    gets its share of the room left (room / active workers, at least one), so the last configs are measured by
    many workers at once. Active: holding a live claim, or recorded or claimed within the last two beats."""
    import numpy as np

    from relay_tune.tuning.distributed import PostgresDatabase
    from relay_tune.tuning.simulated import simulated_tasks

    tasks = simulated_tasks("small")
    task = tasks[0]
    rng = np.random.default_rng(0)
    configs = list({c.key: c for c in (task.space.sample(rng) for _ in range(200))}.values())[:20]
    database = PostgresDatabase(pg_url)
    claimed, recorded, in_flight = database.claim(tasks, 12, task, configs[:4])
    assert (len(claimed), recorded, in_flight) == (4, 0, 0)  # room 12, one active worker: the whole round
    # three other workers of this model: two recorded a moment ago, one recorded long ago (not active any more)
    _sql(pg_url, f"INSERT INTO relay_tune_claims (workload_key, target, config_key, worker, done, beat_at) VALUES "
                 f"('{task.key}', '{task.target}', 'other-1', 'a:1:1', true, clock_timestamp()), "
                 f"('{task.key}', '{task.target}', 'other-2', 'b:2:2', true, clock_timestamp()), "
                 f"('{task.key}', '{task.target}', 'other-3', 'c:3:3', true, clock_timestamp() - interval '1 hour') "
                 f"RETURNING 1")
    claimed, recorded, in_flight = database.claim(tasks, 12, task, configs[4:8])
    assert (len(claimed), in_flight) == (3, 4)  # room 12 - 4 = 8 among 3 active workers: 3 of the 4 asked for
    claimed, _, in_flight = database.claim(tasks, 12, task, configs[8:12])
    assert (len(claimed), in_flight) == (2, 7)  # room 5: 2
    claimed, _, in_flight = database.claim(tasks, 12, task, configs[12:16])
    assert (len(claimed), in_flight) == (1, 9)  # room 3: 1
    claimed, _, in_flight = database.claim(tasks, 12, task, configs[16:20])
    assert (len(claimed), in_flight) == (1, 10)  # room 2: still at least one
    claimed, _, in_flight = database.claim(tasks, 12, task, configs[16:20])
    assert (len(claimed), in_flight) == (1, 11)
    assert database.claim(tasks, 12, task, configs[16:20])[0] == []  # the budget is all claimed
    database.release_claims()


def test_a_dead_workers_claims_return_after_the_grace_period(pg_url: str, tmp_path: Path) -> None:
    """A worker on "another host" (so no local process check can notice its death) claims a batch and is
    SIGKILLed in the middle of measuring it; only the heartbeat tells the survivor. Its claims are failed after the
    grace period, enqueued again and measured by the survivor: the budget is met exactly."""
    env = _env(RELAY_TUNE_HEARTBEAT="1,3")
    doomed = _simulated_worker(pg_url, tmp_path / "doomed.jsonl", 12, 60.0, host="elsewhere", env=env)
    deadline = time.monotonic() + 120
    claimed: list[tuple] = []
    while time.monotonic() < deadline and not claimed:
        time.sleep(0.3)
        try:
            claimed = _sql(pg_url, "SELECT a.value_json FROM trials t JOIN trial_user_attributes a USING "
                                   "(trial_id) WHERE t.state = 'RUNNING' AND a.key = 'config_key'")
        except Exception:  # tables not created yet
            claimed = []
    assert claimed, doomed.communicate(timeout=5)
    while time.monotonic() < deadline and not _sql(pg_url, "SELECT 1 FROM relay_tune_claims WHERE NOT done"):
        time.sleep(0.1)  # the tpe search asks its study first, then claims the round in the database
    # `logs --storage` lists it from the claims table: measuring, its round claimed
    watched = _relay_tune("logs", "--storage", pg_url, env=env)
    assert watched.returncode == 0, watched.stderr
    assert "1 worker(s) measuring now on 1 host(s)" in watched.stdout, watched.stdout
    line = re.search(r"elsewhere:(\d+):\d+ \(host elsewhere\): measuring, (\d+) claimed, 0 recorded", watched.stdout)
    assert line and int(line.group(1)) == doomed.pid and int(line.group(2)) >= 1, watched.stdout
    doomed.send_signal(signal.SIGKILL)
    doomed.wait(timeout=30)
    time.sleep(4.5)  # past the grace period (3 s, plus one beat interval for claims)
    watched = _relay_tune("logs", "--storage", pg_url, env=env)
    assert watched.returncode == 0, watched.stderr
    assert "0 worker(s) measuring now" in watched.stdout and "1 dead" in watched.stdout, watched.stdout
    assert re.search(r"elsewhere:\d+:\d+ \(host elsewhere\): dead, [1-9]\d* claimed", watched.stdout), watched.stdout
    survivor = _simulated_worker(pg_url, tmp_path / "survivor.jsonl", 12, 0.05, env=env)
    out, err = survivor.communicate(timeout=240)
    assert survivor.returncode == 0, err
    assert json.loads(out.strip().splitlines()[-1])["measured"] == 12
    keys = {row[0] for row in _sql(pg_url, "SELECT config_key FROM relay_tune_records")}
    assert len(keys) == 12
    # The dead worker's claims were failed and their configs enqueued again: each one was measured by the survivor
    # or still waits in its study's queue (the scheduler spent the freed budget on whichever task it preferred).
    dead = {json.loads(value) for (value,) in claimed}
    assert not dead & {json.loads(v) for (v,) in _sql(
        pg_url, "SELECT a.value_json FROM trials t JOIN trial_user_attributes a USING (trial_id) "
                "WHERE t.state = 'RUNNING' AND a.key = 'config_key'")}
    failed = _sql(pg_url, "SELECT count(*) FROM trials WHERE state = 'FAIL'")[0][0]
    retried = _sql(pg_url, "SELECT count(*) FROM trial_user_attributes WHERE key = 'retry_of'")[0][0]
    assert failed >= len(dead) and retried >= len(dead)
    waiting = _sql(pg_url, "SELECT count(*) FROM trials WHERE state = 'WAITING'")[0][0]
    assert len(dead - keys) <= waiting


# ---------------------------------------------------------------------------------------------------------------
# The host-wide measurement lock
# ---------------------------------------------------------------------------------------------------------------

_LOCK_WORKER = """
import json, sys, time
from relay_tune.tuning.hostlock import HostLockedRunner
from relay_tune.tuning.runner import Runner
from relay_tune.records.measure import RunResult

class Timed(Runner):
    def run(self, task, artifact):
        start = time.time(); time.sleep(0.15); return RunResult(costs=(start, time.time()))

runner = HostLockedRunner(Timed(), sys.argv[1])
spans = {"build": [], "run": []}
for _ in range(5):
    start = time.time(); time.sleep(0.15); spans["build"].append((start, time.time()))  # a build: no lock
    spans["run"].append(runner.run(None, None).costs)
print(json.dumps(spans))
"""


def test_measurements_of_workers_on_one_host_never_overlap(tmp_path: Path) -> None:
    lock = tmp_path / "measure.lock"
    workers = [subprocess.Popen([sys.executable, "-c", _LOCK_WORKER, str(lock)], env=_env(),
                                stdout=subprocess.PIPE, text=True) for _ in range(3)]
    spans = [json.loads(w.communicate(timeout=60)[0]) for w in workers]
    runs = sorted(span for s in spans for span in s["run"])
    assert len(runs) == 15
    assert all(earlier[1] <= later[0] for earlier, later in itertools.pairwise(runs))  # one at a time
    # builds take no lock: some build of one worker overlaps a build or a measurement of another
    assert any(b[0] < o[1] and o[0] < b[1] for i, mine in enumerate(spans) for b in mine["build"]
               for j, theirs in enumerate(spans) if j != i for o in theirs["build"] + theirs["run"])


# ---------------------------------------------------------------------------------------------------------------
# The commands on a study, and Optuna's own API reading it
# ---------------------------------------------------------------------------------------------------------------


def _relay_tune(*args: str, timeout: float = 600, env: dict[str, str] | None = None) \
        -> subprocess.CompletedProcess[str]:
    code = "import sys; from relay_tune.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], env=env or _env(), capture_output=True, text=True,
                          timeout=timeout)


def test_logs_export_plot_build_and_optuna_read_the_study(pg_url: str, model_file: Path, tmp_path: Path) -> None:
    done = _relay_tune(str(model_file), "--trials", "10", "--storage", pg_url, "--log", str(tmp_path / "w.jsonl"),
                       "--search", "tpe", "-o", str(tmp_path / "w.rtmod"))
    assert done.returncode == 0, done.stderr
    # (a long grace period for the reader: the worker's last record was before its build, seconds ago)
    summary = _relay_tune("logs", "--storage", pg_url, env=_env(RELAY_TUNE_HEARTBEAT="5,300"))
    assert summary.returncode == 0, summary.stderr
    assert "10 records in postgresql://" in summary.stdout and "dense 1x864 * 20x864" in summary.stdout
    assert "0 worker(s) measuring now" in summary.stdout and "0 trial(s) RUNNING" in summary.stdout
    # the worker that just finished, from the claims table: everything it claimed is recorded
    assert re.search(r"\(host [^)]+\): no claim, 0 claimed, 10 recorded, last heartbeat or record [0-9.]+ s ago",
                     summary.stdout), summary.stdout
    exported = tmp_path / "all.jsonl"
    assert _relay_tune("logs", "export", "--storage", pg_url, "-o", str(exported)).returncode == 0
    records = read_records(exported)
    assert len(records) == 10 and records == read_records(tmp_path / "w.jsonl")
    again = _relay_tune("logs", "export", "--storage", pg_url, "-o", str(exported))
    assert again.returncode == 1 and "--force" in again.stderr
    png = tmp_path / "curves.png"
    plotted = _relay_tune("logs", "plot", "--storage", pg_url, "-o", str(png))
    assert plotted.returncode == 0, plotted.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    # every task of the study, as recorded (the in-graph check of tuned records has its own tests)
    built = _relay_tune("build", str(model_file), "--storage", pg_url, "--no-check-tuned", "-o",
                        str(tmp_path / "g.rtmod"))
    assert built.returncode == 0, built.stderr
    tuned_tasks = {r.workload_key for r in records if r.ok}
    assert f"({len(tuned_tasks)} tuned" in built.stdout

    # As optuna-dashboard reads a storage: a fresh process, Optuna's own API, the SQLAlchemy URL of the driver.
    reader = ("import json, sys, optuna\n"
              "url = sys.argv[1]\n"
              "summaries = optuna.get_all_study_summaries(url)\n"
              "out = {}\n"
              "for s in summaries:\n"
              "    study = optuna.load_study(study_name=s.study_name, storage=url)\n"
              "    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]\n"
              "    out[s.study_name] = [len(done), study.best_value]\n"
              "print(json.dumps(out))\n")
    sa_url = pg_url.replace("postgresql://", "postgresql+psycopg://", 1)
    read = subprocess.run([sys.executable, "-c", reader, sa_url], capture_output=True, text=True, timeout=120)
    assert read.returncode == 0, read.stderr
    studies = json.loads(read.stdout)
    assert len(studies) == len({r.workload_key for r in records})  # one study per task that got trials
    best = {r.workload_key: min(x.cost for x in records if x.workload_key == r.workload_key and x.ok)
            for r in records if r.ok}
    for name, (complete, best_value) in studies.items():
        key = name.split("|")[0]
        assert complete >= 1 and best_value == pytest.approx(best[key])


# ---------------------------------------------------------------------------------------------------------------
# Four real workers, two of them killed and restarted
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_four_workers_two_killed_and_restarted(pg_url: str, model_file: Path, tmp_path: Path) -> None:
    """4 `relay-tune` processes on one database with a budget of 120 trials; two are SIGKILLed at random moments
    and started again. Exactly 120 measurements are recorded, none twice, every finished trial has its record,
    and the model built from the database uses the global best."""
    rng = random.Random(os.getpid())
    env = _env(RELAY_TUNE_HEARTBEAT="1,4", RELAY_TUNE_MEASURE_LOCK=str(tmp_path / "measure.lock"))
    code = "import sys; from relay_tune.cli import main; sys.exit(main(sys.argv[1:]))"

    def start(i: int, attempt: int) -> subprocess.Popen[str]:
        log = tmp_path / f"worker{i}.jsonl"
        return subprocess.Popen(
            [sys.executable, "-c", code, str(model_file), "--trials", "120", "--storage", pg_url, "--log", str(log),
             "--search", "tpe", "--seed", str(10 * i + attempt), "--jobs", "1",
             "-o", str(tmp_path / f"worker{i}.rtmod")],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    workers = {i: start(i, 0) for i in range(4)}
    killed = []
    for victim in (1, 3):
        time.sleep(rng.uniform(8.0, 25.0))
        if workers[victim].poll() is None:
            workers[victim].send_signal(signal.SIGKILL)
            workers[victim].wait(timeout=30)
            killed.append(victim)
            workers[victim] = start(victim, 1)  # a restarted worker continues the study
    outputs = {}
    for i, worker in workers.items():
        out, err = worker.communicate(timeout=900)
        assert worker.returncode == 0, err[-3000:]
        outputs[i] = out
    assert killed, "no worker was still running when it was to be killed"

    rows = _sql(pg_url, "SELECT workload_key, config_key FROM relay_tune_records")
    assert len(rows) == 120
    assert max(Counter(rows).values()) == 1  # 0 duplicated configs per workload
    assert _sql(pg_url, "SELECT count(*) FROM relay_tune_events WHERE event = 'duplicate_measurement'") == [(0,)]
    # every finished (measured) trial has its record
    finished = _sql(pg_url, "SELECT s.study_name, a.value_json FROM trials t JOIN studies s USING (study_id) "
                            "JOIN trial_user_attributes a USING (trial_id) WHERE t.state = 'COMPLETE' "
                            "AND a.key = 'config_key'")
    recorded = {(w, c) for w, c in rows}
    assert finished and all((name.split("|")[0], json.loads(value)) in recorded for name, value in finished)
    # the mirrors: what each worker measured, never twice across workers
    mirrored = [(r.workload_key, r.config_key) for i in range(4) for r in read_records(tmp_path / f"worker{i}.jsonl")]
    assert max(Counter(mirrored).values()) == 1 and set(mirrored) <= recorded

    # the model built from the database uses the global best of each task: the lookup `tune_model` builds with
    from relay_tune.cli import load_model
    from relay_tune.compile import build
    from relay_tune.records.database import top_k
    from relay_tune.tuning.distributed import PostgresDatabase
    from relay_tune.tuning.relay_task import tasks_from_module
    from relay_tune.tuning.tune_model import best_steps_lookup

    mod = load_model(str(model_file))
    every = PostgresDatabase(pg_url).all_records()
    tasks = [t for t in tasks_from_module(mod, "llvm") if any(r.workload_key == t.key and r.ok for r in every)]
    assert len(tasks) >= 2
    lookup = best_steps_lookup(tasks, database=PostgresDatabase(pg_url))
    used: dict[str, object] = {}

    def recording(key: str, target: object) -> object:
        used[key] = lookup(key, target)
        return used[key]

    model = build(mod, target="llvm", logs=recording)
    for task in tasks:
        best = top_k([r for r in every if r.workload_key == task.key], 1)[0]
        assert used[task.key] == list(task.steps(best.config))
    assert sum(t.tuned for t in model.plan.tasks) == len(tasks)
    for out in outputs.values():
        assert "tuning results" in out and "end-to-end latency" in out
