"""Scaling of tuning on many workers against one PostgreSQL database, with simulated measurement.

    python -m experiments distributed                      # 1, 4, 16, 64 workers, 1 s per trial
    python -m experiments distributed --workers 1 4 --trial-s 0.5 --per-worker 10 --space small

Each worker is a separate process running the production driver, search (`--search`, default xgb), scheduler,
claims, heartbeats and PostgreSQL records (`python -m relay_tune.tuning.simulated`); only the measurement is
simulated: building returns at once and running sleeps `--trial-s` seconds (`relay_tune.tuning.simulated`), so
the numbers show what the machinery costs, not what kernels cost. The budget is `--per-worker` trials times the
number of workers, at most `--max-budget`; the two tasks' spaces (`--space large`: 3,778 configs) hold that
budget with room to spare. Workers set up (imports, connections) before a common start time, so process start-up
is not counted; the tuning session's own set-up (its Optuna studies, the first reads) is.

Two throughputs: whole-run (records / time from the common start until the last worker has ended: set-up of
the session, the first round, the tail where the last configs leave workers idle, and the shutdown all count)
and steady-state (records per second between the first and the last `--steady` share of the records, by their
commit time in the database: what a long run approaches).

Reported per worker count: trials/s, the ideal (workers / trial seconds), their ratio, and per trial the time a
worker spent outside measuring: `storage` (claiming configs within the budget, counting records, inserting
the record) and `search` (ranking and choosing configs, mirroring results into the Optuna study; Optuna's storage
calls included), the CPU time a worker process used per trial while tuning, how long a round's claim takes
(`relay_tune_claim`: the server counts the budget and inserts the claims under a lock it holds for about a
millisecond of that; the rest is the round trip), and the host's 1-minute
load average when the run ends (the workers share this host's cores with the server and with anything else). The
database is a throwaway cluster this script starts (PostgreSQL's initdb/pg_ctl must be installed; as root it runs
them as the `postgres` user), or `--admin-url` of an existing server. The rows also go to `--out` as JSON
(default experiments/results/distributed.json).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from experiments import UsageError

ROOT = Path(__file__).resolve().parents[1]


def _as_server_user(command: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


@contextmanager
def throwaway_cluster(max_connections: int) -> Iterator[str]:
    initdb = shutil.which("initdb") or next(iter(sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))[::-1]), None)
    if initdb is None:
        raise UsageError("PostgreSQL is not installed (no initdb); install it (apt-get install postgresql) or pass "
                         "--admin-url")
    bindir = Path(initdb).resolve().parent
    folder = Path(tempfile.mkdtemp(prefix="relay-tune-bench-pg-"))
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres", "postgres")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    subprocess.run(_as_server_user([str(bindir / "initdb"), "-D", str(folder / "data"), "-A", "trust", "-U",
                                    "postgres", "--no-sync"]), check=True, capture_output=True)
    # fsync stays on: the storage overhead is measured with durable commits, as a real server would do them.
    options = f"-k {folder} -p {port} -c listen_addresses='' -c max_connections={max_connections}"
    subprocess.run(_as_server_user([str(bindir / "pg_ctl"), "-D", str(folder / "data"), "-l",
                                    str(folder / "server.log"), "-o", options, "-w", "start"]), check=True,
                   capture_output=True)
    try:
        yield f"postgresql://postgres@/postgres?host={folder}&port={port}"
    finally:
        subprocess.run(_as_server_user([str(bindir / "pg_ctl"), "-D", str(folder / "data"), "-m", "fast", "stop"]),
                       capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


def fresh_database(admin_url: str) -> str:
    import psycopg

    name = f"bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    head, _, query = admin_url.partition("?")
    return head.rsplit("/", 1)[0] + "/" + name + (f"?{query}" if query else "")


def run_workers(url: str, workers: int, per_worker: int, max_budget: int, trial_s: float, search: str, batch: int,
                space: str, steady: float, folder: Path) -> dict[str, float]:
    budget = min(workers * per_worker, max_budget)
    # Set-up (imports, connections) of many processes on a small machine takes a while: start them all, then
    # let them begin together.
    start_at = time.time() + 10.0 + 1.5 * workers
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    procs = [subprocess.Popen(
        [sys.executable, "-m", "relay_tune.tuning.simulated", "--storage", url, "--trials", str(budget),
         "--log", str(folder / f"w{workers}-{i}.jsonl"), "--seconds", str(trial_s), "--search", search,
         "--batch", str(batch), "--seed", str(i), "--space", space, "--start-at", str(start_at)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(workers)]
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=3600)
        if proc.returncode != 0:
            raise SystemExit(f"a worker failed:\n{err[-2000:]}")
        reports.append(json.loads(out.strip().splitlines()[-1]))
    late = [r for r in reports if r["ended_at"] - r["wall_s"] > start_at + 1.0]
    if late:
        print(f"  warning: {len(late)} worker(s) were not set up by the common start time", flush=True)
    wall = max(r["ended_at"] for r in reports) - start_at
    measured = sum(r["measured"] for r in reports)
    import psycopg

    with psycopg.connect(url) as connection:
        recorded, distinct = connection.execute(
            "SELECT count(*), count(DISTINCT (workload_key, target, config_key)) FROM relay_tune_records").fetchone()
        times = [float(t) for (t,) in connection.execute(
            "SELECT extract(epoch FROM created_at) FROM relay_tune_records ORDER BY created_at").fetchall()]
    # the rows between the first and the last `steady` share of the records, by commit time
    first, last = int(steady * len(times)), len(times) - 1 - int(steady * len(times))
    steady_rate = (last - first) / (times[last] - times[first]) if last > first and times[last] > times[first] \
        else float("nan")
    claim_s = sum(r["seconds"].get("claim", 0.0) for r in reports)
    rounds = sum(r["seconds"].get("rounds", 0.0) for r in reports)
    storage = sum(r["seconds"].get("storage", 0.0) for r in reports)
    search_s = sum(r["seconds"].get("search", 0.0) for r in reports)
    return {"workers": workers, "trial_s": trial_s, "budget": budget, "measured": measured, "recorded": recorded,
            "distinct": distinct, "duplicates": sum(r["duplicates"] for r in reports), "wall_s": wall,
            "trials_per_s": recorded / wall, "ideal_per_s": workers / trial_s,
            "efficiency": (recorded / wall) / (workers / trial_s),
            "steady_trials_per_s": steady_rate, "steady_efficiency": steady_rate / (workers / trial_s),
            "last_record_s": times[-1] - start_at if times else float("nan"),
            "storage_ms_per_trial": 1e3 * storage / max(1, measured),
            "search_ms_per_trial": 1e3 * search_s / max(1, measured),
            "claim_ms_per_round": 1e3 * claim_s / max(1.0, rounds),
            "cpu_ms_per_trial": 1e3 * sum(r.get("cpu_s", 0.0) for r in reports) / max(1, measured),
            "load_avg_1min": os.getloadavg()[0],
            "median_worker_trials": statistics.median(r["measured"] for r in reports)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--trial-s", type=float, default=1.0, help="simulated seconds per trial (default 1)")
    parser.add_argument("--per-worker", type=int, default=40, help="budget per worker (default 40 trials)")
    parser.add_argument("--max-budget", type=int, default=2560,
                        help="cap on the budget (default 2560: the large space has 3,778 configs, the small one 260)")
    parser.add_argument("--space", choices=("small", "large"), default="large",
                        help="the simulated tasks' spaces (default large)")
    parser.add_argument("--steady", type=float, default=0.1,
                        help="share of the records left out at each end for the steady-state rate (default 0.1)")
    parser.add_argument("--search", default="xgb", help="search strategy of the workers (default xgb)")
    parser.add_argument("--batch", type=int, default=4, help="trials per round (default 4)")
    parser.add_argument("--admin-url", help="an existing server's admin URL instead of a throwaway cluster")
    parser.add_argument("--out", type=Path, default=Path("experiments/results/distributed.json"),
                        help="where the rows go as JSON")


def run(args: argparse.Namespace) -> int:
    if min(args.workers) < 1 or args.trial_s < 0 or args.per_worker < 1:
        raise UsageError("--workers and --per-worker must be at least 1, --trial-s at least 0")
    import optuna
    import sqlalchemy

    print(f"optuna {optuna.__version__}, sqlalchemy {sqlalchemy.__version__}, {os.cpu_count()} cores; "
          f"search {args.search}, {args.per_worker} trials per worker, {args.trial_s} s per trial, "
          f"{args.batch}-trial rounds, {args.space} space", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="relay-tune-bench-") as folder:
        cluster = throwaway_cluster(max(100, 6 * max(args.workers) + 20)) if args.admin_url is None else None
        admin = cluster.__enter__() if cluster is not None else args.admin_url
        try:
            for workers in args.workers:
                row = run_workers(fresh_database(admin), workers, args.per_worker, args.max_budget, args.trial_s,
                                  args.search, args.batch, args.space, args.steady, Path(folder))
                rows.append(row)
                print(f"{workers:>4} workers: {row['recorded']} recorded ({row['distinct']} distinct, "
                      f"{row['duplicates']} refused duplicates) in {row['wall_s']:.1f} s = "
                      f"{row['trials_per_s']:.2f} trials/s of ideal {row['ideal_per_s']:.1f} "
                      f"({row['efficiency']:.2f}x), steady state {row['steady_trials_per_s']:.2f} "
                      f"({row['steady_efficiency']:.2f}x), last record at {row['last_record_s']:.1f} s; "
                      f"per trial: storage {row['storage_ms_per_trial']:.0f} ms, "
                      f"search {row['search_ms_per_trial']:.0f} ms, worker CPU {row['cpu_ms_per_trial']:.0f} ms; "
                      f"claim {row['claim_ms_per_round']:.0f} ms per round; load average {row['load_avg_1min']:.1f}",
                      flush=True)
        finally:
            if cluster is not None:
                cluster.__exit__(None, None, None)
    print("\n| workers | trials recorded (budget) | duplicates | wall (s) | trials/s | ideal | ratio "
          "| steady trials/s | steady ratio | storage ms/trial | search ms/trial "
          "| worker CPU ms/trial | claim ms/round | load avg (1 min) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['workers']} | {r['recorded']} ({r['budget']}) | {r['duplicates']} | {r['wall_s']:.1f} | "
              f"{r['trials_per_s']:.2f} | {r['ideal_per_s']:.0f} | {r['efficiency']:.2f} | "
              f"{r['steady_trials_per_s']:.2f} | {r['steady_efficiency']:.2f} | {r['storage_ms_per_trial']:.0f} | "
              f"{r['search_ms_per_trial']:.0f} | {r['cpu_ms_per_trial']:.0f} | {r['claim_ms_per_round']:.0f} | "
              f"{r['load_avg_1min']:.1f} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1))
    print(f"wrote {args.out}")
    return 0
