"""Integration modes on real git: speculative and batched rounds end where serial ends.

A differential test over random batches: Lanes whose check fails once an earlier Lane's work
is on the candidate, slow checks, and passing ones, all settled in one tick; each batch runs
once per mode from the same repository state, and the outcome (which Lanes integrate, which
park and why, the batch branch's tree) must be serial's.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import pytest

from lanes_es.domain import events as ev
from tests.engine import Engine, Task
from tests.gitfixtures import descriptor, fails_if_exists, run_git

pytestmark = pytest.mark.usefixtures("store_url")  # each test once on SQLite, once on PostgreSQL

SHA = re.compile(r"\b[0-9a-f]{40}\b")
RUN = re.compile(r"run-[0-9a-f-]{36}")


def random_tasks(seed: int) -> dict[str, Task]:
    rng = random.Random(seed)
    count = rng.randint(3, 5)
    tasks: dict[str, Task] = {}
    for index in range(count):
        task_id = f"t{index}"
        roll = rng.random()
        if index and roll < 0.35:
            verification = fails_if_exists(f"t{rng.randrange(index)}.txt")  # fails once that Lane is under it
        elif roll < 0.55:
            verification = descriptor(["-c", "import time; time.sleep(0.3)"])  # a slow check
        else:
            verification = None
        tasks[task_id] = Task([f"{task_id}.txt"], verification=verification)
    return tasks


def run_batch(tmp_path: Path, tasks: dict[str, Task], mode: str,
              store_url: str | None = None) -> tuple[Engine, dict[str, Any]]:
    engine = Engine.create(tmp_path / mode, tasks, store_url=store_url)
    engine.authorize(max_parallel=len(tasks), integration=mode, verify_workers=2)
    report = engine.tick()
    offers = {task_id: engine.provision(task_id, report) for task_id in tasks}
    engine.tick(offers=offers)
    for task_id in tasks:
        engine.deliver(task_id, f"{task_id}.txt", f"{task_id}\n")
    return engine, engine.tick()


def outcome(engine: Engine) -> dict[str, Any]:
    children = [(c["task_id"], c["state"], SHA.sub("<sha>", c["reason"] or "")) for c in engine.batch.record["children"]]
    listed = run_git(engine.root, "ls-tree", "-r", "--name-only", f"imm/{engine.slug}").stdout.decode().split()
    tree = sorted(RUN.sub("run-<id>", path) for path in listed)
    return {"children": children, "tree": tree, "commits": len(engine.batch.record["commits"])}


def events_of(engine: Engine, kind: type) -> list[Any]:
    return [event for event in engine.deps.store.events(engine.batch.id) if isinstance(event, kind)]


# Three random batches, the backends shared out between them (what is compared is git's and the record's): CI time.
@pytest.mark.parametrize("store_url, seed", [("sqlite", 1), ("postgresql", 2), ("sqlite", 3)], indirect=["store_url"])
def test_speculative_and_batched_end_where_serial_ends(tmp_path: Path, seed: int, another_store):
    """Each mode's repository has a store of its own (the same Initiative is authorized in each)."""
    tasks = random_tasks(seed)
    expected = outcome(run_batch(tmp_path, tasks, "serial", another_store())[0])
    for mode in ("speculative", "batched", "adaptive"):
        engine, _ = run_batch(tmp_path, tasks, mode, another_store())
        assert outcome(engine) == expected, mode


def test_a_speculative_round_records_every_candidate_verdict_and_discard(tmp_path: Path):
    tasks = {"t0": Task(["t0.txt"]), "t1": Task(["t1.txt"], verification=fails_if_exists("t0.txt")),
             "t2": Task(["t2.txt"])}
    engine, report = run_batch(tmp_path, tasks, "speculative")
    assert [(c["task_id"], c["state"]) for c in report["children"]] == [
        ("t0", "integrated"), ("t1", "needs_human"), ("t2", "integrated")]
    built = [event.lanes for event in events_of(engine, ev.CandidateBuilt)]
    assert built == [["t0"], ["t0", "t1"], ["t0", "t1", "t2"], ["t0", "t2"]]
    verdicts = [(event.lanes, event.passed) for event in events_of(engine, ev.CandidateVerified)]
    # t0+t1+t2 stood on t0+t1: cancelled once t0+t1 failed, unless its checks all ended first (then verified
    # and discarded): never both, and never landed on.
    stacked = ["t0", "t1", "t2"]
    cancelled = [event.lanes for event in events_of(engine, ev.CandidateCancelled)]
    discarded = [event.lanes for event in events_of(engine, ev.CandidateDiscarded)]
    assert (cancelled, discarded) in (([stacked], []), ([], [stacked]))
    expected = [(["t0"], True), (["t0", "t1"], False), (["t0", "t2"], True)] + ([(stacked, False)] if discarded else [])
    assert sorted(verdicts) == sorted(expected)
    rebuilt = events_of(engine, ev.CandidateBuilt)[-1]
    assert rebuilt.reparented_from is not None and rebuilt.reparented_from != rebuilt.parent
    assert engine.batch.integration == "speculative"
    from lanes_es.audit.replay import replay
    from lanes_es.projections.audit_html import render_audit_html

    events = engine.deps.store.events(engine.batch.id)
    replayed = replay(events)
    assert replayed.ok, replayed.failures
    assert [step.event for step in replayed.steps].count("CandidateVerified") == len(expected)
    page = render_audit_html(engine.batch.id, events)
    assert f"speculative: {len(expected)} candidates verified, {len(expected) - 2} failed" in page
    assert ("CandidateDiscarded" if discarded else "CandidateCancelled") in page


def test_a_batched_round_verifies_the_top_candidate_only_and_says_so(tmp_path: Path, capsys):
    from lanes_es.cli.main import main

    tasks = {f"t{index}": Task([f"t{index}.txt"]) for index in range(3)}
    engine, report = run_batch(tmp_path, tasks, "batched")
    assert report["batch_state"] == "completed"
    capsys.readouterr()
    assert main(["--root", engine.root, "status", engine.slug]) == 0
    assert "integration: batched, 2 verify workers" in capsys.readouterr().out
    verified = events_of(engine, ev.CandidateVerified)
    assert [(event.lanes, event.passed, event.unverified_intermediates) for event in verified] == [
        (["t0", "t1", "t2"], True, ["t0", "t1"])]
    assert {check.task_id for check in verified[0].checks} == {"t0", "t1", "t2"}  # every check of the batch


def test_a_batched_bisection_runs_only_the_checks_that_failed_on_the_candidate_above(tmp_path: Path, another_store):
    """t2's work breaks t0's check. The top (t0, t1, t2) fails on t0's check only; the bisection's (t0, t1) runs
    t0's check and takes t1's from the top, where it passed with more work on top; t2 parks on the top, as in
    serial, for the same failed check."""
    tasks = {"t0": Task(["t0.txt"], verification=fails_if_exists("t2.txt")), "t1": Task(["t1.txt"]),
             "t2": Task(["t2.txt"])}
    expected = outcome(run_batch(tmp_path, tasks, "serial", another_store())[0])
    engine, _ = run_batch(tmp_path, tasks, "batched", another_store())
    assert outcome(engine) == expected
    assert [(c[0], c[1]) for c in expected["children"]] == [("t0", "integrated"), ("t1", "integrated"),
                                                            ("t2", "needs_human")]
    assert "t0:A1 failed on candidate" in expected["children"][2][2]
    top, half = events_of(engine, ev.CandidateVerified)
    assert (top.lanes, top.passed, half.lanes, half.passed) == (["t0", "t1", "t2"], False, ["t0", "t1"], True)
    assert [(c.task_id, c.passed, c.covered_by) for c in top.checks] == [
        ("t2", True, None), ("t0", False, None), ("t1", True, None)]
    assert sorted((c.task_id, c.covered_by, bool(c.outputs)) for c in half.checks) == [
        ("t0", None, True), ("t1", top.commit, False)]
    # a covered check is no verdict on the half's tree: nothing reuses it
    assert not any(key[0] == "t1" and value[2] == half.commit for key, value in engine.batch.passed_checks.items())
    from lanes_es.audit.replay import replay

    replayed = replay(engine.deps.store.events(engine.batch.id))
    assert replayed.ok, replayed.failures


@pytest.mark.parametrize("mode", ["serial", "speculative"])
def test_a_released_sibling_is_rerun_too(tmp_path: Path, mode: str):
    """A deliberate difference from upstream, which drops a sibling from the rerun set once its Lane
    is released: whether a sibling's check reruns must not depend on when a steward removed a Lane."""
    tasks = {"a": Task(["a.txt"], verification=fails_if_exists("b.txt")), "b": Task(["b.txt"])}
    engine = Engine.create(tmp_path, tasks)
    engine.authorize(max_parallel=2, integration=mode)
    report = engine.tick()
    engine.tick(offers={task_id: engine.provision(task_id, report) for task_id in tasks})
    engine.deliver("a", "a.txt", "a\n")
    engine.tick()
    engine.release("a")
    engine.tick()
    assert engine.states() == ["released", "enrolled"]
    engine.deliver("b", "b.txt", "b\n")
    report = engine.tick()
    assert engine.states() == ["released", "needs_human"]
    assert report["children"][1]["reason"].startswith("batch_integration_check_failed: a:A1 failed on candidate")


def flaky_once(counter: Path) -> str:
    """Passes, then fails once, then passes: run 0 is the Lane's QA, run 1 the first candidate run that is not
    the Lane's own tree (that one reuses QA's verdict)."""
    return descriptor(["-c", f"import os,sys; p={str(counter)!r}; n=int(open(p).read()) if os.path.exists(p) else 0; "
                             f"open(p,'w').write(str(n+1)); sys.exit(1 if n == 1 else 0)"])


@pytest.mark.parametrize("reruns", [0, 1])
def test_the_flake_policy_reruns_a_check_from_before_the_lane_and_records_it(tmp_path: Path, reruns: int, capsys):
    from lanes_es.cli.main import main

    tasks = {"a": Task(["a.txt"]), "t0": Task(["t0.txt"], verification=flaky_once(tmp_path / "counter"))}
    engine = Engine.create(tmp_path, tasks)
    engine.authorize(max_parallel=2, integration="serial", flake_reruns=reruns)
    report = engine.tick()
    engine.tick(offers={task_id: engine.provision(task_id, report) for task_id in tasks})
    engine.deliver("a", "a.txt", "a\n")
    engine.deliver("t0", "t0.txt", "t0\n")
    report = engine.tick()
    capsys.readouterr()
    assert main(["--root", engine.root, "flakes", "--json"]) == 0
    import json
    listed = json.loads(capsys.readouterr().out)
    if not reruns:
        assert engine.states() == ["integrated", "needs_human"]
        assert listed == []
        return
    assert report["batch_state"] == "completed"
    check = events_of(engine, ev.CandidateVerified)[-1].checks[0]
    assert (check.task_id, check.passed, check.attempts, check.flaky) == ("t0", True, 2, ["t0:A1"])
    assert [(row["check"], row["passed_on_rerun"], row["batches"]) for row in listed] == [
        ("t0:A1", 1, [engine.batch.id])]


def test_the_adaptive_mode_batches_while_lanes_pass_and_speculates_after_failures(tmp_path: Path):
    """Round one has no history: one batched candidate (bisected when it fails). Three of its four Lanes fail
    there, so round two, in the same batch, speculates; each choice is recorded with what it was chosen from."""
    after_a = fails_if_exists("a.txt")
    tasks = {"a": Task(["a.txt"]), "b": Task(["b.txt"], verification=after_a), "c": Task(["c.txt"], verification=after_a),
             "d": Task(["d.txt"], verification=after_a), "e": Task(["e.txt"]), "f": Task(["f.txt"])}
    engine = Engine.create(tmp_path, tasks)
    engine.authorize(max_parallel=len(tasks), integration="adaptive", verify_workers=2)
    report = engine.tick()
    engine.tick(offers={task_id: engine.provision(task_id, report) for task_id in tasks})
    for task_id in "abcd":
        engine.deliver(task_id, f"{task_id}.txt", f"{task_id}\n")
    engine.tick()
    for task_id in "ef":
        engine.deliver(task_id, f"{task_id}.txt", f"{task_id}\n")
    report = engine.tick()
    assert [(c["task_id"], c["state"]) for c in report["children"]] == [
        ("a", "integrated"), ("b", "needs_human"), ("c", "needs_human"), ("d", "needs_human"), ("e", "integrated"),
        ("f", "integrated")]
    first, second = events_of(engine, ev.IntegrationModeChosen)
    assert (first.mode, first.lanes, first.considered, first.failed, first.batches) == (
        "batched", ["a", "b", "c", "d"], 0, 0, [])
    assert (second.mode, second.window, second.lanes, second.considered, second.failed, second.batches) == (
        "speculative", 2, ["e", "f"], 4, 3, [engine.batch.id])
    modes = {event.mode for event in events_of(engine, ev.CandidateBuilt)}
    assert modes == {"batched", "speculative"}
    assert engine.batch.integration == "adaptive"
