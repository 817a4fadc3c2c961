"""Issue 4's "what must be shown", on a batch the engine really ran (the demo) and through the
command line an auditor uses: `lanes-es verify` names the version of an edited, extended or
deleted stored event; it accepts the completed demo batch and refuses a rewritten batch branch,
a missing audit pair and a commit out of integration order with upstream's codes; and a replay
of a 10,000-event log draws its progress on a real terminal (a pseudo-terminal here).

The demo runs once for this module; every test that changes something works on a copy of
its repository, whose git common dir holds the SQLite store.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from lanes_es.adapters.store import EventStore
from tests.gitfixtures import git_out, identity_env, run_git
from tests.integration.demo_repo import amend_last_without_audit_pair, copy_of, rewrite_documents
from tests.conftest import STORE_BACKENDS, backend_store
from tests.store_rows import StoreRows, store_url_of
from tests.terminal import read_terminal
from tests.unit.audit_logs import long_log
from lanes_es.cli.main import main

SOURCE_ROOT = Path(__file__).resolve().parents[2]


def rows(repo: Path, batch_id: str) -> list[tuple[int, str, bytes]]:
    """(version, event class, stored state) of every stored event of the batch."""
    found = StoreRows(store_url_of(repo)).query("SELECT originator_version, topic, state FROM {events} "
                                                "WHERE originator_id=? ORDER BY originator_version", batch_id)
    return [(version, topic.rpartition(":")[2], bytes(state)) for version, topic, state in found]


def version_of(repo: Path, batch_id: str, event: str, nth: int = 0) -> tuple[int, bytes]:
    return [(version, state) for version, name, state in rows(repo, batch_id) if name == event][nth]


def sql(repo: Path, statement: str, *args: Any) -> None:
    assert StoreRows(store_url_of(repo)).execute(statement, *args) == 1


def cli(capsys: pytest.CaptureFixture[str], repo: Path, *args: str) -> tuple[int, str, list[str]]:
    """Exit code, stdout and its FAIL lines."""
    code = main(["--root", str(repo), *args])
    out = capsys.readouterr().out
    return code, out, [line for line in out.splitlines() if line.startswith("FAIL ")]


# ---------------------------------------------------------------- the stored log


def test_the_untouched_demo_verifies_and_replays(demo, capsys):
    repo, batch_id = demo
    code, out, failed = cli(capsys, repo, "verify", batch_id)
    assert (code, failed) == (0, []), out
    last = json.loads(rows(repo, batch_id)[-1][2])
    assert f"chain head {last['digest']}" in out
    code, out, failed = cli(capsys, repo, "replay", batch_id)
    assert (code, failed) == (0, []) and "every check holds" in out


def test_an_edited_stored_payload_fails_verify_naming_its_version(demo, tmp_path, capsys):
    repo = copy_of(demo, tmp_path)
    batch_id = demo[1]
    version, state = version_of(repo, batch_id, "Integrated", 1)
    commit = json.loads(state)["commit"]
    forged = state.replace(commit.encode(), ("f" * 40).encode())
    sql(repo, "UPDATE {events} SET state=? WHERE originator_id=? AND originator_version=?",
        forged, batch_id, version)
    code, out, failed = cli(capsys, repo, "verify", batch_id)
    assert code == 1 and "NOT verified" in out
    chain = [line for line in failed if line.startswith("FAIL chain")]
    assert chain == [chain[0]] and chain[0].startswith(f"FAIL chain version {version}: digest_mismatch: Integrated ")
    # the forged commit also no longer folds into the state file the run wrote
    assert any(line.startswith("FAIL projection: projection_differs") for line in failed)

    code, out, failed = cli(capsys, repo, "replay", batch_id)
    assert code == 1 and failed == [f"FAIL version {version}: digest_mismatch: " + chain[0].split(": ", 2)[2]]
    code, out, _ = cli(capsys, repo, "replay", batch_id, "--json")
    assert code == 1
    assert [(f["version"], f["rule"]) for f in json.loads(out)["failures"]] == [(version, "digest_mismatch")]


def test_a_key_added_to_a_stored_event_fails_verify_naming_its_version(demo, tmp_path, capsys):
    """Decoding ignores a key the event class does not know; the chain, kept over the stored form, does not."""
    repo = copy_of(demo, tmp_path)
    batch_id = demo[1]
    version, state = version_of(repo, batch_id, "Released", 0)
    sql(repo, "UPDATE {events} SET state=? WHERE originator_id=? AND originator_version=?",
        state.replace(b"{", b'{"approved_by":"auditor",', 1), batch_id, version)
    code, out, failed = cli(capsys, repo, "verify", batch_id)
    assert code == 1
    # and the signed checkpoint outside the store no longer matches the log's first events
    assert [line.split(": ")[0:2] for line in failed] == [[f"FAIL chain version {version}", "digest_mismatch"],
                                                          ["FAIL checkpoint", "checkpoint_root_mismatch"]]


def test_a_deleted_middle_event_fails_verify_naming_its_version(demo, tmp_path, capsys):
    repo = copy_of(demo, tmp_path)
    batch_id = demo[1]
    version, _ = version_of(repo, batch_id, "Settled", 2)
    assert 1 < version < len(rows(repo, batch_id))
    sql(repo, "DELETE FROM {events} WHERE originator_id=? AND originator_version=?", batch_id, version)
    code, out, failed = cli(capsys, repo, "verify", batch_id)
    assert code == 1
    assert f"FAIL chain version {version}: version_gap: version {version} missing" in out
    assert [line for line in failed if line.startswith("FAIL chain")] == [
        line for line in failed if line.startswith(f"FAIL chain version {version}: ")]
    # replay names the hole first, then the step that no longer follows from the state before it
    code, out, failed = cli(capsys, repo, "replay", batch_id)
    assert code == 1 and failed[0].split(": ")[0:2] == [f"FAIL version {version}", "version_gap"]
    assert all(line.split(": ")[1] in ("version_gap", "illegal_transition") for line in failed)


# ---------------------------------------------------------------- the batch branch


def completion_codes(failed: list[str]) -> list[str]:
    return [line.split(": ")[1] for line in failed if line.startswith("FAIL completion: ")]


def test_verify_refuses_a_rewritten_batch_branch(demo, tmp_path, capsys):
    repo = copy_of(demo, tmp_path)
    last = git_out(repo, "rev-parse", "HEAD")
    run_git(repo, "commit", "-q", "--amend", "--no-edit", "--allow-empty",
            env={**identity_env(), "GIT_COMMITTER_DATE": "2001-01-01T00:00:00+00:00"})
    assert git_out(repo, "rev-parse", "HEAD") != last
    code, out, failed = cli(capsys, repo, "verify", demo[1])
    assert code == 1
    assert completion_codes(failed) == ["lineage_mismatch"]
    # the log still holds; the attestation of the replaced commit names it
    others = [line for line in failed if not line.startswith("FAIL completion")]
    assert len(others) == 1 and "branch_rewritten: the batch branch does not contain " + last in others[0]


def test_verify_refuses_a_commit_without_its_audit_pair(demo, tmp_path, capsys):
    repo = copy_of(demo, tmp_path)
    batch_id = demo[1]
    task = git_out(repo, "log", "-n", "1", "--format=%s").split(")")[0].removeprefix("imm(")
    amend_last_without_audit_pair(repo, batch_id)
    code, out, failed = cli(capsys, repo, "verify", batch_id)
    assert code == 1
    assert completion_codes(failed) == ["missing_commit_evidence"]
    assert f"{task} carries no audit pair" in out
    # the log was not changed, so the doctored state file is drift from it
    assert any(line.startswith("FAIL projection: projection_differs") for line in failed)


def test_verify_refuses_a_commit_out_of_integration_order(demo, tmp_path, capsys):
    repo = copy_of(demo, tmp_path)
    batch_id = demo[1]

    def swap_first_two(document: dict[str, Any]) -> None:
        document["commits"][0], document["commits"][1] = document["commits"][1], document["commits"][0]

    rewrite_documents(repo, batch_id, swap_first_two)
    code, out, failed = cli(capsys, repo, "verify", batch_id)
    assert code == 1
    assert completion_codes(failed) == ["commit_order_mismatch"]


# ---------------------------------------------------------------- 10,000 events on a terminal


def run_on_a_terminal(args: list[str], out_path: Path) -> tuple[int, str]:
    """Run the CLI with stderr on a pseudo-terminal and stdout to a file; its exit code and what the terminal got."""
    master, slave = os.openpty()
    with open(out_path, "wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "lanes_es.cli.main", *args], stdin=subprocess.DEVNULL, stdout=out,
                                   stderr=slave, cwd=SOURCE_ROOT)
    os.close(slave)
    shown = read_terminal(master, process)
    return process.wait(timeout=120), shown


@pytest.fixture(scope="module", params=STORE_BACKENDS)
def ten_thousand(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str, str]]:
    base = tmp_path_factory.mktemp("long")
    repo = base / "repo"
    repo.mkdir()
    run_git(repo, "init", "-q", "-b", "main")
    events = long_log(10_000)
    with backend_store(request.param, tmp_path_factory) as url:
        store = EventStore(url)
        store.app.repository.event_store.put(events)
        store.close()
        yield repo, url, events[0].originator_id


def test_a_ten_thousand_event_replay_counts_on_a_terminal(ten_thousand, tmp_path):
    repo, store, batch_id = ten_thousand
    code, terminal = run_on_a_terminal(["--root", str(repo), "--store", str(store), "replay", batch_id],
                                       tmp_path / "out.txt")
    assert code == 0, terminal
    drawn = [part.strip() for part in terminal.split("\r") if part.strip()]
    assert drawn[0] == "replaying 1/10000 events"
    assert drawn[-1] == "replaying 10000/10000 events"
    assert all(part.startswith("replaying ") and part.endswith("/10000 events") for part in drawn)
    counts = [int(part.split()[1].split("/")[0]) for part in drawn]
    assert counts == sorted(counts)
    assert terminal.endswith("\n")  # the counter's line is ended, so the shell prompt starts on its own
    out = (tmp_path / "out.txt").read_text()
    assert out.splitlines()[-1].startswith(f"replayed 10000 events of {batch_id} to version 10000: batch completed")
    assert "every check holds" in out


def test_off_a_terminal_the_replay_draws_no_counter(ten_thousand, tmp_path):
    repo, store, batch_id = ten_thousand
    result = subprocess.run([sys.executable, "-m", "lanes_es.cli.main", "--root", str(repo), "--store", str(store), "replay",
                             batch_id], capture_output=True, cwd=SOURCE_ROOT, timeout=120)
    assert result.returncode == 0
    assert result.stderr == b""
    assert b"\r" not in result.stdout
