"""`lanes-es replay | verify | export | audit` end to end: a real repository, a real store (SQLite and PostgreSQL),
the CLI."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from lanes_es.adapters.store import EventStore
from lanes_es.domain import events as ev
from tests.gitfixtures import run_git
from tests.integration.audit_repo import BATCH, completed
from tests.store_rows import StoreRows
from lanes_es.cli.audit import replay_command
from lanes_es.cli.main import main


@pytest.fixture
def batch(tmp_path: Path, store_url: str) -> tuple[str, str, list]:
    """A completed batch: its repository, its store (on each backend), its log."""
    built = completed(tmp_path)
    events = built.events
    store = EventStore(store_url)
    store.app.repository.event_store.put(events)
    store.close()
    return built.root, store_url, events


def cli(capsys: pytest.CaptureFixture[str], root: str, store: str, *args: str) -> tuple[int, str, str]:
    code = main(["--root", root, "--store", store, *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def sql(url: str, statement: str, *args: object) -> None:
    assert StoreRows(url).execute(statement, *args) == 1


def stored_state(url: str, version: int) -> bytes:
    return StoreRows(url).query("SELECT state FROM {events} WHERE originator_version=?", version)[0][0]


def version_of(events: list, kind: type, task: str) -> int:
    return next(e.originator_version for e in events if isinstance(e, kind) and getattr(e, "task_id", None) == task)


def test_verify_accepts_a_completed_batch_and_prints_the_head(batch, capsys):
    root, store, events = batch
    code, out, _ = cli(capsys, root, store, "verify", BATCH)
    assert code == 0, out
    assert f"chain head {events[-1].digest}" in out
    assert "completion: verified 2 children on the batch branch" in out
    assert out.rstrip().endswith("verified: every check holds")


def test_an_edited_stored_payload_fails_verify_at_its_version(batch, capsys):
    root, store, events = batch
    version = version_of(events, ev.Enrolled, "task-s0")
    state = stored_state(store, version)
    sql(store, "UPDATE {events} SET state=? WHERE originator_id=? AND originator_version=?",
        state.replace(b'"run_id":"run-', b'"run_id":"run-0'), BATCH, version)
    code, out, _ = cli(capsys, root, store, "verify", BATCH)
    assert code == 1
    assert f"FAIL chain version {version}: digest_mismatch" in out
    assert "NOT verified" in out


def test_a_deleted_middle_event_fails_verify_at_its_version(batch, capsys):
    root, store, events = batch
    version = version_of(events, ev.Settled, "task-s1")
    sql(store, "DELETE FROM {events} WHERE originator_id=? AND originator_version=?", BATCH, version)
    code, out, _ = cli(capsys, root, store, "verify", BATCH)
    assert code == 1
    assert f"FAIL chain version {version}: version_gap" in out


def test_verify_fails_on_a_rewritten_branch_and_on_drifted_projections(batch, capsys):
    root, store, _ = batch
    run_git(root, "commit", "-q", "--amend", "--no-edit", "--allow-empty")
    state = Path(root) / f".imm/state/batches/{BATCH}.json"
    state.write_text(state.read_text() + "\n")  # same JSON, other bytes
    code, out, _ = cli(capsys, root, store, "verify", BATCH)
    assert code == 1
    assert f"FAIL projection: projection_differs: {state} differs from the log" in out
    assert "FAIL completion: lineage_mismatch: HEAD" in out


def test_replay_prints_every_step_and_the_record_as_of_a_version(batch, capsys):
    root, store, events = batch
    code, out, _ = cli(capsys, root, store, "replay", BATCH)
    assert code == 0
    assert "Integrated task-s1 [integrated]" in out and "every check holds" in out
    code, out, _ = cli(capsys, root, store, "replay", BATCH, "--at", "4", "--json")
    assert code == 0
    document = json.loads(out)
    assert document["version"] == 4 and len(document["steps"]) == 4 and document["failures"] == []
    assert document["record"]["children"][1]["state"] == "enrolled"
    code, _, err = cli(capsys, root, store, "replay", BATCH, "--at", "999")
    assert code == 2 and "version 999 is not in this log" in err


def test_replay_names_a_tampered_version(batch, capsys):
    root, store, events = batch
    version = version_of(events, ev.Integrated, "task-s0")
    state = stored_state(store, version)
    sql(store, "UPDATE {events} SET state=? WHERE originator_version=?",
        state.replace(b'"adopted":false', b'"adopted":true'), version)
    code, out, _ = cli(capsys, root, store, "replay", BATCH)
    assert code == 1 and f"FAIL version {version}: digest_mismatch" in out


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_replay_shows_progress_on_a_terminal(batch):
    _, url, events = batch
    store = EventStore(url)
    try:
        terminal, out = FakeTerminal(), io.StringIO()
        assert replay_command(store, BATCH, out=out, err=terminal) == 0
    finally:
        store.close()
    assert f"\rreplaying {len(events)}/{len(events)} events" in terminal.getvalue()
    assert terminal.getvalue().endswith("\n")


def test_an_export_verifies_elsewhere_and_a_tampered_one_does_not(batch, capsys, tmp_path: Path):
    root, store, events = batch
    exported = tmp_path / "log.jsonl"
    code, _, err = cli(capsys, root, store, "export", BATCH, "-o", str(exported))
    assert code == 0 and f"wrote {len(events)} events" in err
    assert len(exported.read_bytes().splitlines()) == len(events)
    assert main(["verify", "--export", str(exported)]) == 0
    out = capsys.readouterr().out
    assert f"chain head {events[-1].digest}" in out
    lines = exported.read_bytes().splitlines(keepends=True)
    lines[2] = lines[2].replace(b"imm-lane/demo", b"imm-lane/other")
    exported.write_bytes(b"".join(lines))
    assert main(["verify", "--export", str(exported)]) == 1
    assert "FAIL chain version 3: digest_mismatch" in capsys.readouterr().out
    exported.write_bytes(b"{not json\n")
    assert main(["verify", "--export", str(exported)]) == 1  # a damaged export is a finding (issue 11)
    assert "FAIL export: unreadable_export:" in capsys.readouterr().out
    assert main(["verify", "--export", str(tmp_path / "missing.jsonl")]) == 2  # no file: bad input
    assert "invalid_export" in capsys.readouterr().err


def test_export_to_stdout_is_the_jsonl(batch, capsysbinary):
    root, store, events = batch
    assert main(["--root", root, "--store", store, "export", BATCH]) == 0
    out = capsysbinary.readouterr().out
    assert [json.loads(line)["originator_version"] for line in out.splitlines()] == list(range(1, len(events) + 1))


def test_audit_writes_one_page(batch, capsys, tmp_path: Path):
    root, store, _ = batch
    page = tmp_path / "out" / "audit.html"
    code, out, _ = cli(capsys, root, store, "audit", BATCH, "--html", str(page))
    assert code == 0 and str(page) in out
    text = page.read_text()
    assert text.startswith("<!DOCTYPE html>") and BATCH in text and "task-s1" in text


def test_unknown_batches_and_bad_arguments(batch, capsys):
    root, store, _ = batch
    code, _, err = cli(capsys, root, store, "verify", "batch-nope")
    assert code == 2 and "batch_not_found" in err
    code, _, err = cli(capsys, root, store, "replay", "../x")
    assert code == 2 and "invalid_input" in err
    code, _, err = cli(capsys, root, store, "verify")
    assert code == 2 and "name a BATCH_ID" in err
