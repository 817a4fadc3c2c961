"""`lanes-es bench checkpoint`: what the signed checkpoint costs a tick that appended events.

For logs of several sizes it measures one `anchor_log` after a tick appended an event (read the
ref and its checkpoint, check and hash the appended events from the state kept at the size last
anchored, sign, write one commit): its git spawns, its time in and outside git, and whether it
was incremental. A quiet tick (no event appended) costs nothing: the state is read from a file.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from lanes_es.adapters.anchored_marker import anchored_dir
from lanes_es.adapters.git import STATS


def register(commands: Any) -> None:
    command = commands.add_parser("checkpoint", help="git spawns and time of the signed checkpoint per tick",
                                  description=__doc__)
    command.add_argument("--events", type=int, nargs="+", default=[50, 500, 2000],
                         help="log sizes to measure (default 50 500 2000)")
    command.add_argument("--repeat", type=int, default=5, help="checkpoints measured per size (default 5)")
    command.add_argument("--json", action="store_true", help="print the figures as JSON")
    command.set_defaults(func=lambda args: run_checkpoint_bench(args.events, args.repeat, args.json))


def measure(size: int, repeat: int, workdir: Path) -> dict[str, Any]:
    from lanes_es.adapters.anchor_git import GitAnchor
    from lanes_es.adapters.signing_key import load_signer
    from lanes_es.audit.anchor import anchor_log
    from tools.bench import _repository
    from lanes_es.bootstrap import bootstrap, locate_repository
    from lanes_es.usecases.authorize import authorize
    from lanes_es.usecases.confirmation import BatchOptions, prepare_confirmation
    from lanes_es.usecases.load import initiative
    from lanes_es.usecases.tick import tick

    repo = workdir / f"repo-{size}"
    _repository(repo, 1)
    deps = bootstrap(repo)
    authorize(deps, prepare_confirmation(deps, "bench", BatchOptions(max_parallel=1)))
    tick(deps, "bench")
    batch_id = initiative(deps, "bench").current.batch_id
    common = locate_repository(repo).common_dir
    anchor = GitAnchor(anchored_dir(common))
    batch = deps.store.batch(batch_id)
    while batch.version < size - 1:  # audit-only events: a log of the size asked, nothing else changes
        batch.note_drift("2026-01-01T00:00:00.000Z", "bench")
        if batch.version % 200 == 0:
            deps.store.save(batch)
    deps.store.save(batch)
    spawns, seconds, in_git, incremental = [], [], [], 0
    load_signer(common)  # the key and `cryptography` once, as a process pays them once
    for _ in range(repeat):
        batch.note_drift("2026-01-01T00:00:00.000Z", "bench")  # the tick's new event
        deps.store.save(batch)
        STATS.reset()
        started = time.perf_counter()
        result = anchor_log(anchor, str(repo), batch_id, batch.version,
                            lambda after: deps.store.stored_events(batch_id, after), lambda: load_signer(common))
        seconds.append(time.perf_counter() - started)
        spawns.append(STATS.spawns)
        in_git.append(STATS.seconds)
        incremental += bool(result is not None and result.incremental)
    STATS.reset()
    started = time.perf_counter()
    quiet = anchor_log(anchor, str(repo), batch_id, batch.version, lambda after: deps.store.stored_events(batch_id, after),
                       lambda: load_signer(common))
    quiet_seconds, quiet_spawns = time.perf_counter() - started, STATS.spawns
    assert quiet is None
    deps.store.close()
    return {"events": batch.version, "spawns_per_checkpoint": max(spawns),
            "checkpoint_seconds_median": round(statistics.median(seconds), 4),
            "checkpoint_seconds_max": round(max(seconds), 4),
            "git_seconds_median": round(statistics.median(in_git), 4),
            "outside_git_seconds_median": round(statistics.median(a - b for a, b in zip(seconds, in_git)), 4),
            "incremental": f"{incremental}/{repeat}", "quiet_tick_spawns": quiet_spawns,
            "quiet_tick_seconds": round(quiet_seconds, 5)}


def run_checkpoint_bench(sizes: list[int], repeat: int, as_json: bool) -> int:
    rows = []
    with tempfile.TemporaryDirectory(prefix="lanes-es-bench-checkpoint-") as directory:
        for size in sizes:
            rows.append(measure(size, repeat, Path(directory)))
            if not as_json:
                row = rows[-1]
                print(f"{row['events']:>5} events: {row['spawns_per_checkpoint']} git spawns per checkpoint, "
                      f"{row['checkpoint_seconds_median'] * 1000:.1f} ms median "
                      f"({row['checkpoint_seconds_max'] * 1000:.1f} ms max, "
                      f"{row['git_seconds_median'] * 1000:.1f} ms of it in git, "
                      f"{row['outside_git_seconds_median'] * 1000:.1f} ms outside git; "
                      f"{row['incremental']} incremental); a quiet tick: "
                      f"{row['quiet_tick_spawns']} spawns", flush=True)
    if as_json:
        print(json.dumps(rows, indent=2))
    return 0
