"""Record the replay fixtures in tests/fixtures/logs/ from real runs of the engine.

    .venv/bin/python -m tools.record_fixtures            # write the fixtures that do not exist yet
    .venv/bin/python -m tools.record_fixtures --check    # record again, write nothing, exit 1 on any difference
    .venv/bin/python -m tools.record_fixtures --force resumed   # deliberately replace the named fixtures

Each scenario runs the real engine (the service, the SQLite store, the reference kernel, git
worktrees) on a fresh repository and keeps three files:

    <name>.jsonl        the batch's log, exported from the store's rows (lanes_es.audit.export)
    <name>.state.json   the exact bytes of .imm/state/batches/<batch_id>.json when the run ended
    <name>.report.json  the exact bytes of .imm/state/batches/<batch_id>.report.json

The scenarios: `demo` (lanes_es.cli.demo.run_demo to completion, exactly as `lanes-es demo` runs),
`parked` (an integration conflict and a sibling acceptance that fails on the candidate park
two children, a dependent is skipped), `resumed` (two coordinator corrections, a park on the
correction limit, a fresh confirmation, the resume and completion), `intervened` (an
instruction, a refused offer, a conflict park, then the batch retired). Before anything is
written, each recording must replay to the very bytes the run wrote, so a fixture is never
born failing.

tests/integration/test_replay_fixtures.py replays every fixture with the current code and
requires the same bytes, as Temporal's replayer does for workflow histories. A fixture is
history: it is recorded once and then kept. Changing the schema of an existing event does
NOT call for re-recording; it calls for a `class_version` and an upcaster that keep the old
fixtures passing (docs/adr/0001-event-schema-changes.md). Re-record (`--force NAME`) only
for a deliberate change of what the engine writes for the same run, e.g. a new event in a
scenario, and say so in the commit. Without `--force` an existing fixture that differs is
never overwritten; the command names it and exits 1.

Determinism: `parked`, `resumed` and `intervened` repeat byte for byte on any machine with
git 2.39+. They play the Executor in-process (tests/engine.py): every timestamp comes from
one SteppingClock per scenario, shared by the service and the kernel; uuid4 (batch ids, run
ids, confirmation refs) counts up from 1; git author and committer dates are fixed, so commit
ids repeat; the runs happen under a fixed directory (default /tmp/lanes-es-fixture-runs,
recreated each time), since Lane paths are part of the log. `--check` shows whether that
still holds. `demo` cannot repeat: the demo's Executors are separate processes on the wall
clock, finishing in their own order, so its log is one real run among many possible. It is
recorded once; without `--force demo` it is kept as it is and not run again.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import os
import shutil
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator
from unittest import mock
from lanes_es.usecases.authorize import authorize
from lanes_es.usecases.confirmation import prepare_confirmation
from lanes_es.usecases.retire import retire

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "logs"
WORKDIR = Path("/tmp/lanes-es-fixture-runs")
MARKER = ".lanes-es-fixture-runs"  # a work directory without it is not ours to delete
GIT_DATE = "2030-03-17T17:46:40+00:00"
SUFFIXES = (".jsonl", ".state.json", ".report.json")


@dataclass
class Recording:
    """What a finished run leaves: the batch's stored rows and its two projection files."""

    batch_id: str
    lines: list[bytes]
    state: bytes
    report: bytes | None

    def files(self, name: str) -> dict[str, bytes]:
        found = {f"{name}.jsonl": b"".join(self.lines), f"{name}.state.json": self.state}
        if self.report is not None:
            found[f"{name}.report.json"] = self.report
        return found


# ---------------------------------------------------------------- a repeatable world


@contextlib.contextmanager
def repeatable() -> Iterator[None]:
    """uuid4 counting up from 1, fixed git dates, and checks that start at one fixed moment and take no time
    (a check's start and duration are facts of its log), for one scenario."""
    from datetime import datetime, timezone

    counter = itertools.count(1)

    def next_uuid4() -> uuid.UUID:
        return uuid.UUID(int=next(counter), version=4)

    dates = {"GIT_AUTHOR_DATE": GIT_DATE, "GIT_COMMITTER_DATE": GIT_DATE}
    check_started = datetime(2030, 1, 1, tzinfo=timezone.utc)
    with mock.patch.dict(os.environ, dates), mock.patch("uuid.uuid4", next_uuid4), \
            mock.patch("lanes_es.adapters.qa.check_clock", lambda: check_started), \
            mock.patch("lanes_es.adapters.qa.check_timer", lambda: 0.0):
        yield


def read_recording(root: Path, store: Any, batch_id: str) -> Recording:
    from lanes_es.audit.export import export_lines, stored_lines
    from lanes_es.projections.batch import fold_documents
    from lanes_es.projections.files import read_bytes, report_path, state_path

    events = store.events(batch_id)
    lines = list(stored_lines(store.stored_events(batch_id)))
    # Recorded by the current code, the rows and the events decoded from them export alike;
    # if not, an upcaster is already at work and this is no fresh recording.
    expect(lines == list(export_lines(events)), f"the stored rows of {batch_id} export as its decoded events")
    recording = Recording(batch_id=batch_id, lines=lines, state=read_bytes(state_path(root, batch_id)) or b"",
                          report=read_bytes(report_path(root, batch_id)))
    documents = fold_documents(events)
    expect(documents is not None and documents.record_bytes() == recording.state
           and documents.report_bytes() == recording.report,
           f"the log of {batch_id} replays to the projections the run wrote")
    return recording


def expect(condition: bool, what: str) -> None:
    """A scenario that did not go as written must not become a fixture."""
    if not condition:
        raise SystemExit(f"the scenario did not go as expected: {what}")


# ---------------------------------------------------------------- the scenarios


def record_demo(work: Path) -> Recording:
    """`lanes-es demo` as a user runs it: the wall clock, Executor processes, nothing substituted."""
    from lanes_es.bootstrap import locate_repository, open_store
    from lanes_es.cli.demo import SLUG, run_demo

    with contextlib.redirect_stderr(io.StringIO()):
        code = run_demo(str(work), out=lambda _line: None)
    expect(code == 0, f"the demo exited {code}")
    repository = locate_repository(work / "repo")
    store = open_store(repository)
    try:
        initiative = store.initiative(SLUG)
        expect(initiative is not None and initiative.current is not None, "the demo authorized a batch")
        batch_id = initiative.current.batch_id
        return read_recording(repository.root, store, batch_id)
    finally:
        store.close()


def record_parked(work: Path) -> Recording:
    """A conflict with a user commit and a sibling's acceptance failing on the candidate park two children."""
    from tests.engine import Engine, Task
    from tests.gitfixtures import fails_if_exists

    engine = Engine.create(work, {
        "alpha": Task(["alpha.txt"], verification=fails_if_exists("breaker.txt")),
        "breaker": Task(["breaker.txt"]),
        "conflict": Task(["base.txt"]),
        "dependent": Task(["dep.txt"], blocked_by=["conflict"]),
        "disjoint": Task(["disjoint.txt"]),
    })
    try:
        engine.authorize(max_parallel=4)
        report = engine.tick()
        starters = ["alpha", "breaker", "conflict", "disjoint"]
        engine.tick(offers={task: engine.provision(task, report) for task in starters})
        user_commit(engine, "base.txt", "user edit\n")
        for task in starters:
            engine.deliver(task, "base.txt" if task == "conflict" else f"{task}.txt", f"{task}\n")
        report = engine.tick()
        states = {child["task_id"]: child["state"] for child in report["children"]}
        expect(report["batch_state"] == "needs_human", f"parked batch is {report['batch_state']}")
        expect(states == {"alpha": "integrated", "breaker": "needs_human", "conflict": "needs_human",
                          "dependent": "skipped_blocked", "disjoint": "integrated"}, f"children {states}")
        return read_recording(Path(engine.root), engine.deps.store, engine.batch.id)
    finally:
        engine.deps.store.close()


def record_resumed(work: Path) -> Recording:
    """Two coordinator corrections, a park on the correction limit, a fresh confirmation, completion."""
    from lanes_es.tick_input import InstructionInput
    from tests.engine import Engine, Task
    from tests.gitfixtures import requires_file

    engine = Engine.create(work, {"task-a": Task(["a.txt"], verification=requires_file("a.txt")),
                                  "task-b": Task(["b.txt"], blocked_by=["task-a"])})
    try:
        engine.authorize(qa_failure_limit=1)
        report = engine.tick()
        engine.tick(offers={"task-a": engine.provision("task-a", report)})
        for _ in range(2):
            engine.submit("task-a")  # without a.txt: QA fails, a correction is due
            expect(engine.tick()["handoffs"][0]["role"] == "coordinator", "a coordinator handoff")
            report = engine.tick(instruction=InstructionInput("task-a", "correction", "rethink the design", "idle"))
            expect(report["lane_instruction"]["accepted"] is True, "the correction was accepted")
        engine.submit("task-a")
        report = engine.tick()
        expect(report["batch_state"] == "needs_human", f"parked on the correction limit, not {report['batch_state']}")
        authorize(engine.deps, prepare_confirmation(engine.deps, engine.slug))  # the user's fresh confirmation
        report = engine.tick()
        expect(report["batch_state"] == "running" and engine.states() == ["enrolled", "pending"], "resumed")
        engine.deliver("task-a", "a.txt", "a\n")
        report = engine.tick()
        engine.tick(offers={"task-b": engine.provision("task-b", report)})
        engine.deliver("task-b", "b.txt", "b\n")
        report = engine.tick()
        expect(report["batch_state"] == "completed", f"completed, not {report['batch_state']}")
        return read_recording(Path(engine.root), engine.deps.store, engine.batch.id)
    finally:
        engine.deps.store.close()


def record_intervened(work: Path) -> Recording:
    """An instruction to a running Lane, a refused offer, a conflict park, then the batch retired."""
    from lanes_es.tick_input import InstructionInput
    from tests.engine import Engine, Task
    from tests.gitfixtures import requires_file

    engine = Engine.create(work, {"task-a": Task(["a.txt"], verification=requires_file("a.txt")),
                                  "task-b": Task(["base.txt"])})
    try:
        engine.authorize(max_parallel=2)
        report = engine.tick()
        engine.tick(offers={task: engine.provision(task, report) for task in ("task-a", "task-b")})
        report = engine.tick(instruction=InstructionInput("task-a", "instruction", "write a.txt before submitting",
                                                          "idle"))
        expect(report["lane_instruction"]["accepted"] is True, "the instruction was accepted")
        report = engine.tick(offers={"task-z": str(work / "lanes" / "lane-task-z")})
        expect([refusal["reason"] for refusal in report["lane_refusals"]] == ["batch_lane_unknown_child"],
               f"the unknown offer was refused: {report['lane_refusals']}")
        user_commit(engine, "base.txt", "user edit\n")
        engine.deliver("task-b", "base.txt", "b\n")
        engine.deliver("task-a", "a.txt", "a\n")
        report = engine.tick()
        expect(report["batch_state"] == "needs_human", f"parked, not {report['batch_state']}")
        expect(engine.states() == ["integrated", "needs_human"], f"children {engine.states()}")
        retired = retire(engine.deps, engine.slug)
        expect(retired["batch_state"] == "superseded", f"retired, not {retired['batch_state']}")
        batch_id = retired["batch_id"]
        return read_recording(Path(engine.root), engine.deps.store, batch_id)
    finally:
        engine.deps.store.close()


def user_commit(engine: Any, path: str, content: str) -> None:
    """The user's own commit on the batch branch in the coordinator checkout (the tick adopts it)."""
    from tests.gitfixtures import run_git, write_file

    write_file(engine.root, path, content)
    run_git(engine.root, "add", "--", path)
    run_git(engine.root, "-c", "user.name=User", "-c", "user.email=user@example.invalid", "commit", "-qm", "user edit")


@dataclass(frozen=True)
class Scenario:
    run: Callable[[Path], Recording]
    repeatable: bool  # the same bytes on every recording


SCENARIOS: dict[str, Scenario] = {
    "demo": Scenario(record_demo, repeatable=False),
    "parked": Scenario(record_parked, repeatable=True),
    "resumed": Scenario(record_resumed, repeatable=True),
    "intervened": Scenario(record_intervened, repeatable=True),
}


# ---------------------------------------------------------------- recording and comparing


def fresh_workdir(workdir: Path) -> None:
    """Empty `workdir` for a new run; refuse a directory this tool did not make."""
    if workdir.exists():
        if not (workdir / MARKER).is_file():
            raise SystemExit(f"{workdir} exists and was not made by this recorder; pass another --workdir")
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    (workdir / MARKER).write_text("made by tools/record_fixtures.py; deleted on the next recording\n")


def record(name: str, workdir: Path) -> dict[str, bytes]:
    scenario = SCENARIOS[name]
    with repeatable() if scenario.repeatable else contextlib.nullcontext():
        return scenario.run(workdir / name).files(name)


def differences(recorded: dict[str, bytes], fixtures: Path, name: str) -> list[str]:
    """The fixture files of `name` that are missing, differ from `recorded` or should not exist."""
    found: list[str] = []
    for suffix in SUFFIXES:
        path = fixtures / f"{name}{suffix}"
        expected = recorded.get(path.name)
        actual = path.read_bytes() if path.exists() else None
        if expected != actual:
            found.append(f"{path.name} {'is missing' if actual is None else 'differs' if expected else 'is extra'}")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.record_fixtures", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"scenarios to record (default: all of "
                                                                  f"{', '.join(SCENARIOS)})")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when a recording differs")
    parser.add_argument("--force", action="store_true", help="replace the named fixtures that differ")
    parser.add_argument("--out", type=Path, default=FIXTURES, help="the fixture directory")
    parser.add_argument("--workdir", type=Path, default=WORKDIR, help="where the runs happen (recreated)")
    args = parser.parse_args(argv)
    unknown = [name for name in args.names if name not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario {', '.join(unknown)}; the scenarios are {', '.join(SCENARIOS)}")
    if args.force and not args.names:
        parser.error("--force replaces fixtures only when they are named")
    names = args.names or list(SCENARIOS)
    fresh_workdir(args.workdir)
    failed = False
    for name in names:
        existing = any((args.out / f"{name}{suffix}").exists() for suffix in SUFFIXES)
        if existing and not SCENARIOS[name].repeatable and not args.force:
            print(f"{name}: kept (a recording cannot repeat it; --force {name} to replace it)")
            continue
        recorded = record(name, args.workdir)
        found = differences(recorded, args.out, name)
        if not found:
            print(f"{name}: unchanged")
        elif args.check or (existing and not args.force):
            failed = True
            print(f"{name}: {'; '.join(found)}" + ("" if args.check else " (not overwritten; --force to replace)"))
        else:
            write_fixture(args.out, name, recorded)
            print(f"{name}: recorded ({len(recorded[f'{name}.jsonl'].splitlines())} events)")
    return 1 if failed else 0


def write_fixture(out: Path, name: str, recorded: dict[str, bytes]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for suffix in SUFFIXES:
        path = out / f"{name}{suffix}"
        if path.name in recorded:
            path.write_bytes(recorded[path.name])
        elif path.exists():
            path.unlink()  # the run wrote no report this time: an old one would lie


if __name__ == "__main__":
    sys.exit(main())
