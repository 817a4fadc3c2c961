"""`retire` (upstream's retire_stale_batch) on real repositories (issue 3): the active batch
becomes `superseded` with a report without handoffs (LANE-REC-04), refused while a child is in
flight (LANE-REC-05) or when there is no active batch; also through `lanes-es retire SLUG --yes`."""

from __future__ import annotations

import hashlib
import io
import json

import pytest

from lanes_es.adapters.kernel import ReferenceKernel
from lanes_es.domain.report import TERMINAL_NEXT_ACTIONS
from lanes_es.errors import ServiceError
from lanes_es.projections.files import report_path, state_path
from tests.engine import Engine, Task
from tests.engine_more import batch_files, claim_path, enroll, make_engine, state_bytes
from lanes_es.usecases.confirmation import prepare_confirmation
from lanes_es.usecases.load import active_batch
from lanes_es.usecases.retire import retire, retire_target
from lanes_es.usecases.tick import tick

# Every test here goes through the store: run each on SQLite and on PostgreSQL (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("store_url")


def parked_trio(tmp_path) -> Engine:
    """s1 integrated, s2 parked (its claim lost), s3 blocked by s2; max_parallel 3, as upstream's fixture."""
    engine = make_engine(tmp_path, {"s1": Task(["one.txt"]), "s2": Task(["two.txt"]),
                                    "s3": Task(["three.txt"], blocked_by=["s2"])})
    engine.authorize(max_parallel=3)
    enroll(engine, "s1", "s2")
    engine.deliver("s1", "one.txt", "1\n")
    claim_path(engine, "s2").unlink()
    report = engine.tick()
    assert report["batch_state"] == "needs_human"
    assert engine.states() == ["integrated", "needs_human", "skipped_blocked"]
    return engine


def test_a_parked_lane_batch_is_retired_as_superseded_and_stays_v2(tmp_path):  # LANE-REC-04
    """Ports LANE-DISP-04."""
    engine = parked_trio(tmp_path)
    batch_id = engine.batch.id
    children = engine.batch.record["children"]
    report = retire(engine.deps, engine.slug)
    assert report["contract"] == "assurance_kernel/batch_run_report/v1"
    assert (report["batch_id"], report["batch_state"], report["max_parallel"]) == (batch_id, "superseded", 3)
    assert report["handoffs"] == []
    assert "explicit literal-user disposition" in report["reason"]
    assert report["next_action"] == TERMINAL_NEXT_ACTIONS["superseded"]
    state = json.loads(state_path(engine.root, batch_id).read_text())
    assert state["contract"] == "assurance_kernel/batch_run_state/v2" and state["batch_state"] == "superseded"
    assert state["children"] == children  # the Lane bindings, run ids and parks are kept as they were
    assert [c["lane"]["branch"] if c["lane"] else None for c in state["children"]] == [
        "imm-lane/initiative-slug/s1", "imm-lane/initiative-slug/s2", None]
    assert state["children"][0]["lane"]["run_id"].startswith("run-")
    assert json.loads(report_path(engine.root, batch_id).read_text()) == report
    # retired: nothing active is left to retire or to tick
    assert active_batch(engine.deps, engine.slug) is None
    with pytest.raises(ServiceError) as absent:
        retire(engine.deps, engine.slug)
    assert absent.value.code == "stale_batch_absent"
    with pytest.raises(ServiceError) as no_tick:
        tick(engine.deps, engine.slug)
    assert no_tick.value.code == "batch_authorization_invalid"


class SimulatedCrash(BaseException):
    """A power cut: nothing in the engine catches it."""


def test_a_child_in_flight_blocks_retirement(tmp_path, monkeypatch):  # LANE-REC-05
    """Ports LANE-DISP-05."""
    engine = make_engine(tmp_path, {"s1": Task(["one.txt"]), "s2": Task(["two.txt"])})
    engine.authorize(max_parallel=2)
    report = engine.tick()
    lanes = {task_id: engine.provision(task_id, report) for task_id in ("s1", "s2")}

    def crash(self, *args, **kwargs):
        raise SimulatedCrash("after the admission was saved, before the enrollment")

    monkeypatch.setattr(ReferenceKernel, "enroll_task", crash)
    with pytest.raises(SimulatedCrash):
        engine.tick(offers=lanes)
    assert engine.states() == ["lane_admitted", "pending"]
    before = batch_files(engine)
    with pytest.raises(ServiceError) as refused:
        retire(engine.deps, engine.slug)
    assert refused.value.code == "stale_batch_in_flight"
    assert "still mid-flight" in str(refused.value)
    assert batch_files(engine) == before
    monkeypatch.undo()
    engine.tick(offers={"s2": lanes["s2"]})
    assert engine.states() == ["enrolled", "enrolled"]
    with pytest.raises(ServiceError) as refused:
        retire(engine.deps, engine.slug)
    assert refused.value.code == "stale_batch_in_flight"
    assert engine.batch.batch_state == "running"


def test_without_an_active_batch_there_is_nothing_to_retire(tmp_path):
    """Ports LANE-DISP-08."""
    engine = make_engine(tmp_path, {"s1": Task(["one.txt"])})
    with pytest.raises(ServiceError) as never:
        retire(engine.deps, engine.slug)
    assert never.value.code == "stale_batch_absent"
    engine.authorize()
    enroll(engine, "s1")
    engine.deliver("s1", "one.txt", "1\n")
    assert engine.tick()["batch_state"] == "completed"
    completed = state_bytes(engine)
    with pytest.raises(ServiceError) as terminal:
        retire(engine.deps, engine.slug)
    assert terminal.value.code == "stale_batch_absent"
    assert "already completed" in str(terminal.value)
    assert state_bytes(engine) == completed


def test_retire_through_the_cli(tmp_path, capsys, monkeypatch):
    from lanes_es.cli.main import main

    engine = parked_trio(tmp_path)
    parked = batch_files(engine)
    monkeypatch.setattr("sys.stdin", io.StringIO(""))  # no terminal: nobody to ask
    assert main(["--root", engine.root, "retire", engine.slug]) == 2
    assert "confirmation_port_unavailable" in capsys.readouterr().err
    assert batch_files(engine) == parked
    assert main(["--root", engine.root, "retire", engine.slug, "--yes", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["batch_state"] == "superseded" and report["handoffs"] == []
    assert main(["--root", engine.root, "retire", engine.slug, "--yes"]) == 2
    assert "stale_batch_absent" in capsys.readouterr().err


def test_an_authorization_never_ticked_can_be_retired_so_a_new_plan_can_be_confirmed(tmp_path):
    """lanes-es keeps authorizations in the log: one that never started a batch has no record to
    supersede, and retiring it is what lets a changed plan be confirmed under a new batch id."""
    engine = make_engine(tmp_path, {"s1": Task(["one.txt"])})
    stale = engine.authorize()
    assert prepare_confirmation(engine.deps, engine.slug).batch_id == stale  # otherwise the same batch again
    retired = retire(engine.deps, engine.slug)
    assert (retired["batch_id"], retired["batch_state"]) == (stale, "superseded")
    assert "explicit literal-user disposition" in retired["reason"]
    assert batch_files(engine) == {}  # no record was ever written, and none is now
    assert prepare_confirmation(engine.deps, engine.slug).batch_id != stale


def running_with_nothing_in_flight(tmp_path) -> tuple[Engine, str]:
    """A running batch that asked for a Lane: retirable, and one tick away from moving."""
    engine = make_engine(tmp_path, {"s1": Task(["one.txt"])})
    engine.authorize()
    report = engine.tick()
    assert engine.batch.batch_state == "running" and engine.states() == ["pending"]
    return engine, engine.provision("s1", report)


def test_a_record_that_moves_while_the_user_decides_is_not_retired(tmp_path):
    """docs/upstream.md#retiring-a-batch: the write is a compare-and-swap on the record's exact bytes read before the
    gate; a tick that lands in between (here: it admits a Lane) makes the retirement
    `plan_changed`, and nothing is written."""
    engine, lane = running_with_nothing_in_flight(tmp_path)
    target = retire_target(engine.deps, engine.slug)
    assert target.record_digest == hashlib.sha256(state_bytes(engine)).hexdigest()  # the record the user is asked about
    engine.tick(offers={"s1": lane})  # elsewhere, a tick goes on while the user is asked
    moved = batch_files(engine)
    assert hashlib.sha256(state_bytes(engine)).hexdigest() != target.record_digest
    with pytest.raises(ServiceError) as changed:
        retire(engine.deps, engine.slug, target)
    assert changed.value.code == "plan_changed"
    assert "changed while the user was deciding; nothing was retired" in str(changed.value)
    assert batch_files(engine) == moved
    assert active_batch(engine.deps, engine.slug).id == target.batch_id


def test_retire_through_the_cli_compares_the_record_read_before_the_prompt(tmp_path, capsys, monkeypatch):
    """The prompt is the gate: a record that moves while it is open is refused as plan_changed (exit 2)."""
    from lanes_es.cli.main import main

    engine, lane = running_with_nothing_in_flight(tmp_path)

    def answer_after_a_tick(prompt: str) -> str:
        assert engine.batch.id in prompt
        engine.tick(offers={"s1": lane})
        return "y"

    monkeypatch.setattr("sys.stdin", type("Tty", (io.StringIO,), {"isatty": lambda self: True})(""))
    monkeypatch.setattr("builtins.input", answer_after_a_tick)
    assert main(["--root", engine.root, "retire", engine.slug]) == 2
    assert "plan_changed" in capsys.readouterr().err
    assert engine.batch.batch_state != "superseded"
    assert not report_path(engine.root, engine.batch.id).exists() or "superseded" not in report_path(
        engine.root, engine.batch.id).read_text()
