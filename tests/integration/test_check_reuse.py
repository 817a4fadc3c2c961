"""What a check's verdict is about, and what the integration step does with it (issue 25).

- A verdict is reused only on byte-identical inputs: the same task's acceptance on a tree with the
  same identity (domain/check_inputs.py). The Lane's QA tree and its first candidate, when the batch
  head is still the Lane's base, are the same tree: the candidate reuses QA's verdict, and an event
  names both. Any change to the inputs (a byte, a mode bit, a link target, a file added or removed,
  the acceptance) is another identity, so the check runs again.
- A candidate's checks run at once in serial mode too (bounded by verify_workers).
- A speculative candidate stacked on one that failed is cancelled at once: its running check is killed.
- A failed candidate is kept under a ref, and the Parked event carries the failed check's output tail,
  its reason, when it started and how long it ran.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lanes_es.adapters.candidate_git import CandidateTree
from lanes_es.adapters.qa import materialized_tree
from lanes_es.domain import events as ev
from lanes_es.domain.check_inputs import acceptance_digest, blob_id, tree_identity
from tests.engine import Engine, Task
from tests.gitfixtures import commit_all, descriptor, make_repo, run_git, write_file

pytestmark = pytest.mark.usefixtures("store_url")  # each test once on SQLite, once on PostgreSQL


def python(code: str, **options: object) -> str:
    """A check running `code` (lines allowed: an argv entry may hold no control character, so it is exec'd)."""
    return descriptor(["-c", f"exec({code!r})"], **options)  # type: ignore[arg-type]


def counting(counter: Path) -> str:
    """A check that appends a line to `counter` (outside the tree) each time it runs."""
    return python(f"open({str(counter)!r}, 'a').write('run\\n')")


def events_of(engine: Engine, kind: type) -> list[object]:
    return [event for event in engine.deps.store.events(engine.batch.id) if isinstance(event, kind)]


def settle_together(engine: Engine, deliveries: dict[str, str], **options: object) -> dict:
    engine.authorize(max_parallel=len(engine.tasks), **options)
    report = engine.tick()
    engine.tick(offers={task_id: engine.provision(task_id, report) for task_id in engine.tasks})
    for task_id, path in deliveries.items():
        engine.deliver(task_id, path, f"{task_id}\n")
    return engine.tick()


# ---------------------------------------------------------------- the inputs


def test_any_change_to_the_inputs_is_another_identity():
    base = [("a.txt", "100644", blob_id(b"a\n")), ("bin/run", "100755", blob_id(b"#!/bin/sh\n")),
            ("link", "120000", blob_id(b"a.txt"))]
    same = tree_identity(base)
    assert tree_identity(list(reversed(base))) == same  # an order of listing is not an input
    changed = [
        [("a.txt", "100644", blob_id(b"a!\n")), *base[1:]],  # a byte
        [base[0], ("bin/run", "100644", blob_id(b"#!/bin/sh\n")), base[2]],  # a mode bit
        [*base[:2], ("link", "120000", blob_id(b"bin/run"))],  # a link's target
        [*base, ("new.txt", "100644", blob_id(b""))],  # a file added
        base[1:],  # a file removed
        [("b.txt", "100644", blob_id(b"a\n")), *base[1:]],  # a file renamed
    ]
    identities = {tree_identity(entries) for entries in changed}
    assert len(identities) == len(changed) and same not in identities
    # The audit records lanes-es writes are no input: a check does not see them.
    assert tree_identity([*base, (".imm/audit/t/run-1/task-record.json", "100644", blob_id(b"{}"))]) == same
    assert acceptance_digest({"acceptance": [{"id": "A1"}]}) != acceptance_digest({"acceptance": [{"id": "A2"}]})


def test_the_qa_copy_and_the_commit_of_the_same_files_are_one_identity(tmp_path):
    """What QA sees of a worktree (git's modes, no .imm/audit) is what a check sees of the commit of it."""
    root = make_repo(tmp_path / "repo")
    write_file(root, "src/tool.sh", "#!/bin/sh\necho hi\n")
    os.chmod(Path(root) / "src/tool.sh", 0o775)  # group bits git does not keep
    os.chmod(Path(root) / "base.txt", 0o664)
    os.symlink("base.txt", Path(root) / "alias")
    write_file(root, "untracked.txt", "not yet committed\n")
    with materialized_tree(root) as (copy, seen):
        assert oct(os.stat(Path(copy) / "src/tool.sh").st_mode & 0o777) == "0o755"
        assert oct(os.stat(Path(copy) / "base.txt").st_mode & 0o777) == "0o644"
    write_file(root, ".imm/audit/t/run-1/terminal-proof.json", "{}\n")  # written after QA, in the lane commit
    commit = commit_all(root, "delivery")
    assert CandidateTree.read(root, commit).identity == seen
    write_file(root, "base.txt", "changed\n")
    with materialized_tree(root) as (_, changed):
        assert changed != seen


# ---------------------------------------------------------------- reuse on real batches


def test_the_first_candidate_reuses_the_lanes_qa_verdict_and_an_event_names_both(tmp_path, store_url):
    counter = tmp_path / "runs"
    engine = Engine.create(tmp_path, {"a": Task(["a.txt"], verification=counting(counter))}, store_url=store_url)
    report = settle_together(engine, {"a": "a.txt"}, integration="serial")
    assert report["batch_state"] == "completed"
    assert counter.read_text().count("run") == 1  # QA only: the candidate is the Lane's own tree
    settled, = events_of(engine, ev.Settled)
    reused, = events_of(engine, ev.CheckVerdictReused)
    integrated, = events_of(engine, ev.Integrated)
    assert (reused.task_id, reused.reused_from, reused.reused_event, reused.reused_commit) == (
        "a", settled.originator_version, "Settled", None)
    assert reused.commit == integrated.commit and reused.tree == settled.qa_tree
    check, = integrated.checks
    assert (check.passed, check.reused_from, check.tree) == (True, settled.originator_version, settled.qa_tree)


def test_a_candidate_with_other_work_on_it_runs_the_check_again(tmp_path, store_url):
    """Serial, the second Lane's candidate holds the first Lane's work: a's check sees another tree and runs."""
    counter = tmp_path / "runs"
    tasks = {"a": Task(["a.txt"], verification=counting(counter)), "b": Task(["b.txt"])}
    engine = Engine.create(tmp_path, tasks, store_url=store_url)
    report = settle_together(engine, {"a": "a.txt", "b": "b.txt"}, integration="serial")
    assert report["batch_state"] == "completed"
    assert counter.read_text().count("run") == 2  # a's QA (reused by a's candidate), then on b's candidate
    reused, = events_of(engine, ev.CheckVerdictReused)  # a's candidate only: b's holds a's work too
    assert (reused.task_id, reused.lanes) == ("a", ["a"])
    second = events_of(engine, ev.Integrated)[-1]
    rerun = next(check for check in second.checks if check.task_id == "a")
    assert rerun.reused_from is None and rerun.outputs and rerun.outputs[0].started_at is not None


def test_speculative_rounds_reuse_qa_for_the_first_candidate_only(tmp_path, store_url):
    counter = tmp_path / "runs"
    tasks = {"a": Task(["a.txt"], verification=counting(counter)), "b": Task(["b.txt"]), "c": Task(["c.txt"])}
    engine = Engine.create(tmp_path, tasks, store_url=store_url)
    report = settle_together(engine, {"a": "a.txt", "b": "b.txt", "c": "c.txt"}, integration="speculative",
                             verify_workers=2)
    assert report["batch_state"] == "completed"
    assert counter.read_text().count("run") == 3  # QA, then on a+b and a+b+c: the candidate a alone reused QA
    reused, = events_of(engine, ev.CheckVerdictReused)
    assert (reused.task_id, reused.lanes) == ("a", ["a"])


# ---------------------------------------------------------------- concurrency and cancellation


def meets(mine: Path, theirs: Path, when: str) -> str:
    """On a tree holding `when`: say it started, then wait (up to 30 s) for the other check to start too."""
    return python(f"import os, sys, time\nif os.path.exists({when!r}):\n"
                  f"    open({str(mine)!r}, 'w').close()\n"
                  f"    deadline = time.time() + 30\n"
                  f"    while not os.path.exists({str(theirs)!r}):\n"
                  f"        if time.time() > deadline: sys.exit(1)\n"
                  f"        time.sleep(0.02)\n", timeout_ms=60000)


def test_serial_runs_a_candidates_checks_at_once(tmp_path, store_url):
    """b's candidate reruns a's check beside b's: each waits for the other to have started, which only checks
    that run at the same time can do (run one after the other, the first would give up and fail)."""
    a_started, b_started = tmp_path / "a-started", tmp_path / "b-started"
    tasks = {"a": Task(["a.txt"], verification=meets(a_started, b_started, "b.txt")),
             "b": Task(["b.txt"], verification=meets(b_started, a_started, "a.txt"))}
    engine = Engine.create(tmp_path, tasks, store_url=store_url)
    report = settle_together(engine, {"a": "a.txt", "b": "b.txt"}, integration="serial", verify_workers=2)
    assert report["batch_state"] == "completed", report["reason"]
    assert a_started.exists() and b_started.exists()


def test_a_candidate_stacked_on_a_failure_is_cancelled_and_its_running_check_killed(tmp_path, store_url):
    """c's check sleeps 60 s on any tree: on the candidate a+b+c it runs while b's check fails on a+b. That
    candidate is cancelled at once (the check killed, recorded as cancelled); c lands on a+c."""
    slow = python("import os, time\nif os.path.exists('b.txt'): time.sleep(60)", timeout_ms=120000)
    late_failure = python("import os, sys, time\ntime.sleep(1)\nsys.exit(os.path.exists('a.txt'))")
    tasks = {"a": Task(["a.txt"]), "b": Task(["b.txt"], verification=late_failure), "c": Task(["c.txt"], verification=slow)}
    engine = Engine.create(tmp_path, tasks, store_url=store_url)
    report = settle_together(engine, {"a": "a.txt", "b": "b.txt", "c": "c.txt"}, integration="speculative",
                             verify_workers=4)
    assert [(c["task_id"], c["state"]) for c in report["children"]] == [
        ("a", "integrated"), ("b", "needs_human"), ("c", "integrated")]
    cancelled, = events_of(engine, ev.CandidateCancelled)
    assert (cancelled.lanes, cancelled.because) == (["a", "b", "c"], ["a", "b"])
    killed = next(check for check in cancelled.checks if check.task_id == "c")
    assert killed.cancelled and not killed.passed
    assert killed.outputs and killed.outputs[0].reason.startswith("cancelled")
    landed = events_of(engine, ev.Integrated)[-1]
    assert landed.task_id == "c"


# ---------------------------------------------------------------- why a check failed


@pytest.mark.parametrize("mode", ["serial", "speculative"])
def test_a_failed_candidate_is_kept_and_its_checks_output_is_on_the_park(tmp_path, mode, capsys):
    loud = python("import os, sys\nprint('line one')\n"
                  "if os.path.exists('a.txt'):\n    print('b cannot live with a')\n    sys.exit(3)")
    tasks = {"a": Task(["a.txt"]), "b": Task(["b.txt"], verification=loud)}
    engine = Engine.create(tmp_path, tasks)
    settle_together(engine, {"a": "a.txt", "b": "b.txt"}, integration=mode)
    assert engine.states() == ["integrated", "needs_human"]
    parked, = events_of(engine, ev.Parked)
    assert parked.candidate and parked.candidate_ref == f"refs/lanes-es/failed/{engine.batch.id}/b"
    kept = run_git(engine.root, "rev-parse", parked.candidate_ref).stdout.decode().strip()
    assert kept == parked.candidate
    assert run_git(engine.root, "show", f"{parked.candidate_ref}:a.txt").stdout == b"a\n"  # inspectable
    failed, = parked.failed_checks
    output, = failed.outputs
    assert failed.task_id == "b" and not failed.passed
    assert output.reason == "python3 exited with code 3"
    assert output.output_tail == "line one\nb cannot live with a"
    assert output.started_at is not None and output.duration_ms is not None and output.duration_ms >= 0
    # status, replay and the audit page say why, and where the candidate is kept
    from lanes_es.cli.main import main
    from lanes_es.projections.audit_html import render_audit_html

    capsys.readouterr()
    assert main(["--root", engine.root, "status", engine.slug]) == 0
    status = capsys.readouterr().out
    assert "why b stopped" in status and "| b cannot live with a" in status and parked.candidate_ref in status
    assert "b:A1: python3 exited with code 3, started " in status
    assert main(["--root", engine.root, "replay", engine.batch.id]) == 0
    assert "| b cannot live with a" in capsys.readouterr().out
    page = render_audit_html(engine.batch.id, engine.deps.store.events(engine.batch.id))
    assert "b cannot live with a" in page and "python3 exited with code 3" in page
