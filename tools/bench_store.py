"""`lanes-es bench store`: the event store on SQLite and PostgreSQL, side by side.

For each backend, on a fresh store (a temporary SQLite file; a PostgreSQL schema made
for the run and dropped after):

- appends: events appended per second by one process, and by 4 processes at once
  (each writes its own batches, a tick of about 5 events per save);
- reads of one batch of `--events` events: the raw floor (the rows read with the
  driver and decoded with msgspec, nothing else), `rebuild --check`, the batch as every
  command but `verify` loads it (its rows checked as they are decoded: numbering, the
  digest chain, the anchored size), beside eventsourcing's unchecked load, `replay` and
  `verify`, in events per second;
- the soak (`tools/soak.py`): `--soak-repos` repositories of `--soak-batches` batches, ticked at
  random by `--soak-processes` processes for `--soak-rounds` rounds each; then nothing lost,
  no duplicate commit, every batch verifies, the read model matches a rebuild from scratch;
- the peak memory (Python allocations, tracemalloc) of a rebuild and of `replay --json`
  of one batch of `--memory-events` events.

Timings live here, never in tests.
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing
import tempfile
import time
import tracemalloc
import uuid
from pathlib import Path
from typing import Any, Callable

PG_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=test"
PG_URL = "postgresql://postgres@127.0.0.1:5432/test"


def register(commands: Any) -> None:
    command = commands.add_parser("store", help="event store throughput and rebuild memory, SQLite and PostgreSQL",
                                  description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    command.add_argument("--events", type=int, default=20_000, help="events in the batch read back (default 20000)")
    command.add_argument("--append-events", type=int, default=4_000,
                         help="events each append run writes in all (default 4000)")
    command.add_argument("--memory-events", type=int, default=100_000,
                         help="events in the batch whose rebuild memory is measured (default 100000; 0 skips)")
    command.add_argument("--soak-rounds", type=int, default=30,
                         help="rounds each soak process plays (default 30; 0 skips the soak)")
    command.add_argument("--soak-repos", type=int, default=5, help="soak repositories (default 5)")
    command.add_argument("--soak-batches", type=int, default=10, help="soak batches per repository (default 10)")
    command.add_argument("--soak-processes", type=int, default=4, help="soak processes (default 4)")
    command.add_argument("--backend", action="append", choices=["sqlite", "postgresql"], default=None,
                         help="measure only this backend (repeatable; default both)")
    command.add_argument("--json", action="store_true", help="print the figures as JSON")
    command.set_defaults(func=run)


# ---------------------------------------------------------------- stores


class Backend:
    """A fresh store URL for a run, and its cleanup."""

    def __init__(self, name: str, workdir: Path) -> None:
        self.name = name
        self.workdir = workdir
        self.schema = f"bench_{uuid.uuid4().hex[:10]}"

    def url(self) -> str:
        if self.name == "sqlite":
            return str(self.workdir / "events.sqlite")
        return f"{PG_URL}?schema={self.schema}"

    def __enter__(self) -> "Backend":
        if self.name == "postgresql":
            import psycopg

            with psycopg.connect(PG_DSN, autocommit=True) as connection:
                connection.execute(f"CREATE SCHEMA {self.schema}")
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.name == "postgresql":
            import psycopg

            with psycopg.connect(PG_DSN, autocommit=True) as connection:
                connection.execute(f"DROP SCHEMA {self.schema} CASCADE")


def _open(url: str) -> Any:
    from lanes_es.adapters.store import EventStore

    return EventStore(url)


# ---------------------------------------------------------------- appends


def _append_worker(url: str, prefix: str, batches: int, events: int) -> int:
    from tools.bench_logs import write_batch

    store = _open(url)
    try:
        return sum(write_batch(store, f"batch-{prefix}-{index}", f"{prefix}-{index}", events, children=4)
                   for index in range(batches))
    finally:
        store.close()


def measure_appends(url: str, total: int, processes: int) -> float:
    per_batch = 200
    batches = max(1, total // per_batch // processes)
    _open(url).close()  # tables made before the clock starts
    started = time.perf_counter()
    if processes == 1:
        appended = _append_worker(url, f"a1-{uuid.uuid4().hex[:6]}", batches, per_batch)
    else:
        tag = uuid.uuid4().hex[:6]
        with multiprocessing.get_context("spawn").Pool(processes) as pool:
            appended = sum(pool.starmap(_append_worker, [(url, f"a{processes}-{tag}-{worker}", batches, per_batch)
                                                         for worker in range(processes)]))
    return appended / (time.perf_counter() - started)


# ---------------------------------------------------------------- reads


def raw_floor(url: str, table: str, batch_id: str) -> int:
    """Read a batch's rows with the driver and decode each with msgspec into its event class; nothing else."""
    import msgspec
    from eventsourcing.utils import resolve_topic

    decoders: dict[str, Any] = {}
    count = 0
    for topic, state in _raw_rows(url, table, batch_id):
        decoder = decoders.get(topic)
        if decoder is None:
            decoder = decoders[topic] = msgspec.json.Decoder(resolve_topic(topic))
        decoder.decode(state)
        count += 1
    return count


def _raw_rows(url: str, table: str, batch_id: str) -> Any:
    if url.startswith("postgresql"):
        import psycopg

        schema = url.rsplit("schema=", 1)[1]
        with psycopg.connect(PG_DSN) as connection:
            yield from connection.execute(
                f"SELECT topic, state FROM {schema}.{table} WHERE originator_id = %s "
                f"ORDER BY originator_version", (batch_id,))
        return
    import sqlite3

    connection = sqlite3.connect(url)
    try:
        yield from connection.execute(f"SELECT topic, state FROM {table} WHERE originator_id = ? "
                                      "ORDER BY originator_version", (batch_id,))
    finally:
        connection.close()


def rebuild_check(store: Any, root: Path, batch_id: str) -> None:
    from lanes_es.usecases.rebuild import rebuild

    rebuild(store, root, [batch_id], check=True)


def replay_json(store: Any, batch_id: str) -> None:
    """`replay --json` into a sink, as into a pipe: the memory measured is the command's, not its output's."""
    import os

    from lanes_es.cli.audit import replay_command

    with open(os.devnull, "w", encoding="utf-8") as sink:
        replay_command(store, batch_id, as_json=True, out=sink, err=io.StringIO())


def verify(store: Any, root: Path, batch_id: str) -> None:
    from lanes_es.cli.audit import verify_command

    verify_command(store, root, batch_id, out=io.StringIO(), err=io.StringIO())


def _rate(events: int, work: Callable[[], Any], repeat: int = 1) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - started)
    return events / best


def _say(text: str) -> None:
    import sys

    print(f"  {time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)


def _peak_mb(work: Callable[[], Any]) -> float:
    tracemalloc.start()
    try:
        work()
        return tracemalloc.get_traced_memory()[1] / 1e6
    finally:
        tracemalloc.stop()


def measure_soak(args: argparse.Namespace, url: str, workdir: Path) -> dict[str, Any]:
    from tools.soak import run_soak

    _say("soak")
    result = run_soak(url, workdir, repos=args.soak_repos, batches=args.soak_batches, processes=args.soak_processes,
                      rounds=args.soak_rounds)
    for finding in result.findings:
        _say(f"soak finding: {finding}")
    return {"soak_seconds": round(result.seconds, 1), "soak_ticks": result.ticks, "soak_busy": result.busy,
            "soak_batches": len(result.batches),
            "soak_completed": sum(1 for state in result.batches.values() if state == "completed"),
            "soak_findings": len(result.findings)}


def measure_backend(name: str, events: int, append_events: int, memory_events: int, workdir: Path) -> dict[str, Any]:
    from tools.bench_logs import write_batch

    row: dict[str, Any] = {"backend": name}
    _say(name)
    with Backend(name, workdir / name) as backend:
        (workdir / name).mkdir(parents=True, exist_ok=True)
        url = backend.url()
        _say("append_1_process")
        row["append_1_process"] = round(measure_appends(url, append_events, 1))
        _say("append_4_processes")
        row["append_4_processes"] = round(measure_appends(url, append_events, 4))
        store = _open(url)
        root = workdir / name / "checkout"
        try:
            _say("writing a batch")
            write_batch(store, "batch-read-1", "read", events, tick_size=200)
            _say("raw_floor")
            row["raw_floor"] = round(_rate(events, lambda: raw_floor(url, store.app.recorder.events_table_name, "batch-read-1"), repeat=3))
            rebuild_check(store, root, "batch-read-1")  # warm
            _say("rebuild_check")
            row["rebuild_check"] = round(_rate(events, lambda: rebuild_check(store, root, "batch-read-1"), repeat=2))
            row["rebuild_of_floor"] = round(row["rebuild_check"] / row["raw_floor"], 3)
            _say("load")  # what every command but verify pays to read a batch: checked as it is decoded
            row["load_unchecked"] = round(_rate(events, lambda: store.app.repository.get("batch-read-1"), repeat=3))
            row["load"] = round(_rate(events, lambda: store.batch("batch-read-1"), repeat=3))
            row["load_of_unchecked"] = round(row["load"] / row["load_unchecked"], 3)
            _say("replay")
            row["replay"] = round(_rate(events, lambda: replay_json(store, "batch-read-1")))
            _say("verify")
            row["verify"] = round(_rate(events, lambda: verify(store, root, "batch-read-1")))
            if memory_events:
                _say("writing a batch")
                write_batch(store, "batch-memory-1", "memory", memory_events, tick_size=200)
                row["memory_events"] = memory_events
                _say("rebuild_peak_mb")
                row["rebuild_peak_mb"] = round(_peak_mb(lambda: rebuild_check(store, root, "batch-memory-1")), 1)
                _say("replay_json_peak_mb")
                row["replay_json_peak_mb"] = round(_peak_mb(lambda: replay_json(store, "batch-memory-1")), 1)
                _say("rebuild_peak_mb_at_events")
                row["rebuild_peak_mb_at_events"] = round(
                    _peak_mb(lambda: rebuild_check(store, root, "batch-read-1")), 1)
                _say("replay_json_peak_mb_at_events")
                row["replay_json_peak_mb_at_events"] = round(_peak_mb(lambda: replay_json(store, "batch-read-1")), 1)
        finally:
            store.close()
    return row


LABELS = [
    ("append_1_process", "appended/s, 1 process"),
    ("append_4_processes", "appended/s, 4 processes"),
    ("raw_floor", "raw read + msgspec decode/s"),
    ("rebuild_check", "rebuild --check ev/s"),
    ("rebuild_of_floor", "rebuild / floor"),
    ("load_unchecked", "batch load, repository.get, unchecked ev/s"),
    ("load", "batch load, chain-checked ev/s"),
    ("load_of_unchecked", "checked load / unchecked"),
    ("replay", "replay --json ev/s"),
    ("verify", "verify ev/s"),
    ("rebuild_peak_mb_at_events", "rebuild peak MB (--events)"),
    ("rebuild_peak_mb", "rebuild peak MB (--memory-events)"),
    ("replay_json_peak_mb_at_events", "replay --json peak MB (--events)"),
    ("replay_json_peak_mb", "replay --json peak MB (--memory-events)"),
    ("soak_seconds", "soak: seconds"),
    ("soak_ticks", "soak: ticks applied"),
    ("soak_busy", "soak: ticks that found the lock held"),
    ("soak_batches", "soak: batches"),
    ("soak_completed", "soak: batches completed"),
    ("soak_findings", "soak: findings (must be 0)"),
]


def run(args: argparse.Namespace) -> int:
    backends = args.backend or ["sqlite", "postgresql"]
    rows = []
    with tempfile.TemporaryDirectory(prefix="lanes-es-bench-store-") as directory:
        for name in backends:
            rows.append(measure_backend(name, args.events, args.append_events, args.memory_events, Path(directory)))
            if args.soak_rounds:
                with Backend(name, Path(directory) / f"soak-{name}") as backend:
                    (Path(directory) / f"soak-{name}").mkdir(parents=True, exist_ok=True)
                    rows[-1].update(measure_soak(args, backend.url(), Path(directory) / f"soak-{name}"))
    failed = any(row.get("soak_findings") for row in rows)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 1 if failed else 0
    print(f"{'':42}" + "".join(f"{row['backend']:>14}" for row in rows))
    for key, label in LABELS:
        if any(key in row for row in rows):
            print(f"{label:42}" + "".join(f"{row.get(key, '-'):>14}" for row in rows))
    return 1 if failed else 0
