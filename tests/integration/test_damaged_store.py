"""A damaged store is refused by every command but `verify`, through the real command line, on both backends.

The damage no decoding sees: one event's payload rewritten (still valid JSON, its digest left as it was),
and the newest event deleted while the checkpoint this machine signed proves the cut. `verify` names it
(exit 1); `status`, `tick`, `rebuild` and `prove` refuse it with the pointer to `verify` (exit 2), a tick
appends nothing over it and a rebuild writes no projection of it. A checkpoint ref deleted while this machine's marker records the size it anchored is a finding
too, and no tick signs a new one over the deletion.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lanes_es.exit_codes import EXIT_FINDING, EXIT_OK
from tests.gitfixtures import run_git
from tests.integration.test_user_errors import SLUG, lanes, refused, rows, started
from tests.store_rows import StoreRows, store_url_of

pytestmark = pytest.mark.usefixtures("store_url")  # each test once on SQLite, once on PostgreSQL


@pytest.fixture
def repo(plain_repo: Path) -> Path:
    return plain_repo  # the demo's repository (tests/integration/conftest.py), its store the test's


def rewrite_payload(repo: Path, batch_id: str, version: int) -> None:
    """One field of one event rewritten in place, the row still valid JSON and its digest as it was."""
    store = StoreRows(store_url_of(repo))
    (state,), = store.query("SELECT state FROM {events} WHERE originator_id = ? AND originator_version = ?",
                            batch_id, version)
    edited = bytes(state).replace(b'"at":"2', b'"at":"1', 1)
    assert edited != bytes(state)
    assert store.execute("UPDATE {events} SET state = ? WHERE originator_id = ? AND originator_version = ?",
                         edited, batch_id, version) == 1


def delete_newest(repo: Path, batch_id: str) -> None:
    store = StoreRows(store_url_of(repo))
    (newest,), = store.query("SELECT MAX(originator_version) FROM {events} WHERE originator_id = ?", batch_id)
    assert store.execute("DELETE FROM {events} WHERE originator_id = ? AND originator_version = ?",
                         batch_id, newest) == 1


def refused_everywhere_but_verify(repo: Path, batch_id: str, rule: str) -> None:
    """`verify` and `replay` find it (exit 1); every other command refuses it and writes nothing."""
    before = rows(repo)
    for finding in (["verify", batch_id], ["replay", batch_id]):
        found = lanes(repo, *finding)
        assert found.returncode == EXIT_FINDING and rule in found.stdout, (finding, found.stdout[-2000:])
    page, exported = repo.parent / "audit.html", repo.parent / "log.jsonl"
    projections = {path: path.read_bytes() for path in (repo / ".imm").rglob("*.json")}
    for command in (["status", SLUG], ["status", "--batch", batch_id], ["tick", SLUG], ["flakes"],
                    ["export", batch_id, "-o", str(exported)], ["audit", batch_id, "-o", str(page)],
                    ["rebuild", batch_id], ["rebuild", "--all", "--check"], ["prove", batch_id, "--event", "1"]):
        line = refused(lanes(repo, *command), f"the event store's log of {batch_id} does not verify", rule,
                       f"`lanes-es verify {batch_id}` lists every finding")
        assert "nothing was read from it or written to it" in line, (command, line)
    assert rows(repo) == before  # the tick appended nothing over the damage
    assert not page.exists() and not exported.exists()
    assert {path: path.read_bytes() for path in (repo / ".imm").rglob("*.json")} == projections  # no rebuild wrote


def test_a_rewritten_payload_is_refused_by_every_command_but_verify(repo):
    batch_id = started(repo)
    rewrite_payload(repo, batch_id, 2)
    refused_everywhere_but_verify(repo, batch_id, "version 2: digest_mismatch")


def test_the_newest_event_removed_while_the_checkpoint_proves_the_cut_is_refused(repo):
    batch_id = started(repo)
    delete_newest(repo, batch_id)
    refused_everywhere_but_verify(repo, batch_id, "log_cut_short")


def test_a_deleted_checkpoint_ref_is_a_finding_and_no_tick_signs_over_it(repo):
    batch_id = started(repo)
    ref = f"refs/lanes-es/checkpoints/{batch_id}"
    run_git(repo, "update-ref", "-d", ref)
    verify = lanes(repo, "verify", batch_id)
    assert verify.returncode == EXIT_FINDING, verify.stdout
    assert "checkpoint_missing" in verify.stdout and "the checkpoint ref was deleted" in verify.stdout
    ticked = lanes(repo, "tick", SLUG, "--offer", f"greet={repo.parent / 'nowhere'}")  # a tick that appends
    assert ticked.returncode in (EXIT_OK, 2), ticked.stderr
    assert f"checkpoint not written: {ref} is gone although this machine anchored" in ticked.stderr
    assert run_git(repo, "rev-parse", "--verify", "-q", ref, check=False).returncode != 0  # still gone
    assert lanes(repo, "verify", batch_id).returncode == EXIT_FINDING
