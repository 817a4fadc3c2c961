"""The audit anchored outside the store (issue 13), through the command line on the demo batch:
a signed checkpoint and an attestation per integration on refs/lanes-es/checkpoints/<batch>,
and `verify` finding what a chain alone cannot see."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from eventsourcing.persistence import StoredEvent

from lanes_es.audit.chain import sealed_bytes
from tests.gitfixtures import git_out, run_git
from tests.integration.demo_repo import copy_in_place, copy_of
from tests.store_rows import StoreRows, remove_store, store_url_of
from lanes_es.cli.main import main

_ENCODER = msgspec.json.Encoder(order="sorted")


def ref(batch_id: str) -> str:
    return f"refs/lanes-es/checkpoints/{batch_id}"


def cli(capsys: pytest.CaptureFixture[str], repo: Path, *args: str) -> tuple[int, str]:
    code = main(["--root", str(repo), *args])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def export(capsys, repo: Path, batch_id: str, path: Path) -> list[bytes]:
    assert cli(capsys, repo, "export", batch_id, "-o", str(path))[0] == 0
    return path.read_bytes().splitlines(keepends=True)


def public_key(capsys, repo: Path) -> str:
    code, out = cli(capsys, repo, "key", "show")
    assert code == 0
    return out.strip()


def test_each_tick_that_appended_events_left_a_signed_checkpoint_and_each_integration_an_attestation(demo, capsys):
    repo, batch_id = demo
    record = json.loads((repo / ".imm/state/batches" / f"{batch_id}.json").read_text())
    files = git_out(repo, "ls-tree", "-r", "--name-only", ref(batch_id)).splitlines()
    assert "checkpoint" in files and "summary.dsse.json" in files
    attested = sorted(path.split("-", 1)[1].removesuffix(".dsse.json") for path in files
                      if path.startswith("attestations/"))
    assert attested == sorted(child["task_id"] for child in record["children"])
    note = git_out(repo, "show", f"{ref(batch_id)}:checkpoint")
    [(events,)] = StoreRows(store_url_of(repo)).query("select count(*) from {events} where originator_id = ?",
                                                      batch_id)
    assert note.splitlines()[:2] == [batch_id, str(events)]
    assert int(git_out(repo, "rev-list", "--count", ref(batch_id))) > 1  # one commit per tick that wrote
    mode = os.stat(repo / ".git/lanes-es/signing.key").st_mode & 0o777
    assert mode == 0o600
    code, out = cli(capsys, repo, "verify", batch_id)
    assert code == 0, out
    assert f"checkpoint {events} events" in out and "verified: every check holds" in out


def test_a_cut_off_export_is_found_against_the_repository_ref(demo, tmp_path, capsys):
    repo, batch_id = demo
    lines = export(capsys, repo, batch_id, tmp_path / "log.jsonl")
    (tmp_path / "cut.jsonl").write_bytes(b"".join(lines[:-3]))
    code, out = cli(capsys, repo, "verify", "--export", str(tmp_path / "cut.jsonl"))
    assert code == 1, out
    assert f"log_cut_short: the log holds {len(lines) - 3} events but the signed checkpoint covers {len(lines)}" in out


def test_a_store_whose_newest_events_and_projections_were_deleted_is_found(demo, tmp_path, capsys):
    repo = copy_in_place(demo, tmp_path)
    batch_id = demo[1]
    rows = StoreRows(store_url_of(repo))
    [(last,)] = rows.query("select max(originator_version) from {events} where originator_id = ?", batch_id)
    rows.execute("delete from {events} where originator_id = ? and originator_version > ?", batch_id, last - 2)
    shutil.rmtree(repo / ".imm/state/batches")
    code, out = cli(capsys, repo, "verify", batch_id)
    assert code == 1, out
    assert f"log_cut_short: the log holds {last - 2} events but the signed checkpoint covers {last}" in out
    # and no later tick appends to the shorter log, nor signs over it
    code, out = cli(capsys, repo, "tick", "demo")
    assert code == 2 and f"does not verify (version {last - 1}: log_cut_short" in out, out
    assert rows.query("select max(originator_version) from {events} where originator_id = ?", batch_id) == [(last - 2,)]
    assert git_out(repo, "show", f"{ref(batch_id)}:checkpoint").splitlines()[1] == str(last)


def reseal(lines: list[bytes]) -> list[bytes]:
    """Recompute every digest of an export, as someone rewriting the whole chain would."""
    sealed, previous = [], ""
    for line in lines:
        fields = msgspec.json.decode(line)
        topic = fields.pop("topic")
        fields.pop("digest", None)
        row = StoredEvent(originator_id=fields["originator_id"], originator_version=fields["originator_version"],
                          topic=topic, state=_ENCODER.encode(fields))
        previous = hashlib.sha256(previous.encode() + sealed_bytes(row)).hexdigest()
        sealed.append(_ENCODER.encode({**fields, "digest": previous, "topic": topic}) + b"\n")
    return sealed


def test_a_consistently_rewritten_chain_is_found(demo, tmp_path, capsys):
    repo, batch_id = demo
    lines = export(capsys, repo, batch_id, tmp_path / "log.jsonl")
    enrolled = next(index for index, line in enumerate(lines) if b"events:Enrolled" in line)
    fields = msgspec.json.decode(lines[enrolled])
    fields["run_id"] = "run-00000000-0000-4000-8000-000000000000"  # another run, as if another agent had done it
    rewritten = reseal(lines[:enrolled] + [_ENCODER.encode(fields) + b"\n"] + lines[enrolled + 1:])
    assert rewritten[enrolled:] != lines[enrolled:] and rewritten[:enrolled] == lines[:enrolled]
    (tmp_path / "rewritten.jsonl").write_bytes(b"".join(rewritten))
    code, out = cli(capsys, repo, "verify", "--export", str(tmp_path / "rewritten.jsonl"))
    assert "chain version" not in out  # the chain itself holds: only the checkpoint sees the rewrite
    assert code == 1, out
    assert "checkpoint_root_mismatch" in out


def test_a_reordered_log_is_found(demo, tmp_path, capsys):
    repo, batch_id = demo
    lines = export(capsys, repo, batch_id, tmp_path / "log.jsonl")
    reordered = reseal(lines[:8] + [lines[9], lines[8]] + lines[10:])
    (tmp_path / "reordered.jsonl").write_bytes(b"".join(reordered))
    code, out = cli(capsys, repo, "verify", "--export", str(tmp_path / "reordered.jsonl"))
    assert code == 1, out
    assert "checkpoint_root_mismatch" in out


def test_a_batch_branch_whose_integrated_commit_was_replaced_is_found(demo, tmp_path, capsys):
    repo = copy_of(demo, tmp_path)
    batch_id = demo[1]
    branch = "refs/heads/imm/demo"
    tip = git_out(repo, "rev-parse", branch)
    replaced = git_out(repo, "commit-tree", f"{tip}^{{tree}}", "-p", f"{tip}^", "-m", "other bytes, same tree")
    run_git(repo, "update-ref", branch, replaced, tip)
    code, out = cli(capsys, repo, "verify", batch_id)
    assert code == 1, out
    assert f"branch_rewritten: the batch branch does not contain {tip}" in out


def test_a_commit_slipped_into_the_batch_branch_is_found(demo, tmp_path, capsys):
    repo = copy_of(demo, tmp_path)
    batch_id = demo[1]
    record = json.loads((repo / ".imm/state/batches" / f"{batch_id}.json").read_text())
    first, second = record["commits"][0], record["commits"][1]
    slipped = git_out(repo, "commit-tree", f"{first}^{{tree}}", "-p", first, "-m", "slipped in")
    rest = git_out(repo, "rev-list", "--reverse", f"{first}..imm/demo").splitlines()
    parent = slipped
    for commit in rest:  # replay the later commits on top: their bytes change, so they are not the attested ones
        message = git_out(repo, "log", "-1", "--format=%B", commit)
        parent = git_out(repo, "commit-tree", f"{commit}^{{tree}}", "-p", parent, "-m", message)
    run_git(repo, "update-ref", "refs/heads/imm/demo", parent)
    code, out = cli(capsys, repo, "verify", batch_id)
    assert code == 1, out
    assert second in out and "branch_rewritten" in out


def test_an_untouched_batch_verifies_without_the_store_from_the_export_the_refs_and_the_public_key(demo, tmp_path,
                                                                                                    capsys):
    repo = copy_of(demo, tmp_path)
    batch_id = demo[1]
    key = public_key(capsys, repo)
    export(capsys, repo, batch_id, tmp_path / "log.jsonl")
    remove_store(store_url_of(repo))
    (repo / ".git/lanes-es/signing.key").unlink()  # only the public key is left
    shutil.rmtree(repo / ".imm/state/batches")
    command = [sys.executable, "-m", "lanes_es.cli.main", "--root", str(repo), "verify", "--export", str(tmp_path / "log.jsonl"),
               "--public-key", key]
    done = subprocess.run(command, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "verified: every check holds" in done.stdout
    assert f"({ref(batch_id)} in {repo})" in done.stdout
    # the same without the public key is refused, not passed
    done = subprocess.run(command[:-2], capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 2 and "--public-key" in done.stderr


def test_another_key_does_not_verify_the_checkpoint(demo, tmp_path, capsys):
    from lanes_es.audit.signing import Signer

    repo, batch_id = demo
    other = Signer.generate("lanes-es").verifier.text()
    code, out = cli(capsys, repo, "verify", batch_id, "--public-key", other)
    assert code == 1, out
    assert "checkpoint_signature" in out


def test_an_inclusion_proof_verifies_with_the_public_key_alone(demo, tmp_path, capsys):
    repo, batch_id = demo
    key = public_key(capsys, repo)
    assert cli(capsys, repo, "prove", batch_id, "--event", "3", "-o", str(tmp_path / "proof.json"))[0] == 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code, out = cli(capsys, elsewhere, "verify-proof", str(tmp_path / "proof.json"), "--public-key", key)
    assert code == 0, out
    assert f"verified: event 3 of {batch_id} is in the signed checkpoint" in out
    proof = json.loads((tmp_path / "proof.json").read_text())
    proof["event"] = proof["event"][:-4] + "AAA="
    (tmp_path / "forged.json").write_text(json.dumps(proof))
    code, out = cli(capsys, elsewhere, "verify-proof", str(tmp_path / "forged.json"), "--public-key", key)
    assert code == 1 and "do not hash to the proof's leaf hash" in out


def test_a_checkpoint_behind_the_log_is_a_note_and_the_next_tick_completes_it(demo, tmp_path, capsys):
    """A crash between the events and the checkpoint: the ref one checkpoint behind, the marker lost."""
    repo = copy_in_place(demo, tmp_path)
    batch_id = demo[1]
    newest = git_out(repo, "show", f"{ref(batch_id)}:checkpoint").splitlines()[1]
    run_git(repo, "update-ref", ref(batch_id), f"{ref(batch_id)}~1")
    (repo / ".git/lanes-es/anchored" / f"anchored-{batch_id}").unlink()
    behind = int(newest) - int(git_out(repo, "show", f"{ref(batch_id)}:checkpoint").splitlines()[1])
    code, out = cli(capsys, repo, "verify", batch_id)
    assert code == 0, out
    assert f"note: checkpoint behind by {behind} events" in out
    cli(capsys, repo, "tick", "demo")
    assert git_out(repo, "show", f"{ref(batch_id)}:checkpoint").splitlines()[1] == newest
    code, out = cli(capsys, repo, "verify", batch_id)
    assert code == 0 and "note: checkpoint behind" not in out, out


def test_replay_and_the_audit_page_show_the_checkpoints_and_attestations(demo, tmp_path, capsys):
    repo, batch_id = demo
    sizes = [git_out(repo, "show", f"{commit}:checkpoint").splitlines()[1]
             for commit in git_out(repo, "rev-list", "--reverse", ref(batch_id)).splitlines()]
    integrated = json.loads((repo / ".imm/state/batches" / f"{batch_id}.json").read_text())["children"]
    code, out = cli(capsys, repo, "replay", batch_id)
    assert code == 0, out
    shown = [line.split()[3] for line in out.splitlines() if line.startswith("-- checkpoint signed: ")]
    assert shown == sizes
    assert sum(1 for line in out.splitlines() if line.strip().startswith("attested: attestations/")) == len(integrated)
    assert cli(capsys, repo, "audit", batch_id, "--html", str(tmp_path / "page.html"))[0] == 0
    page = (tmp_path / "page.html").read_text()
    assert "<h2>Checkpoints</h2>" in page
    assert page.count('class="checkpointed"') == len(sizes)
    assert page.count('class="attested"') == 2 * len(integrated)  # the integrations list and the event table


def test_a_checkpoint_costs_two_spawns_and_a_stale_writer_changes_nothing(demo, tmp_path):
    from lanes_es.adapters.anchor_git import GitAnchor
    from lanes_es.adapters.git import STATS
    from lanes_es.adapters.signing_key import load_signer
    from lanes_es.audit.anchor import AnchorRefused, anchor_log
    from lanes_es.bootstrap import bootstrap

    repo = copy_of(demo, tmp_path)
    batch_id = demo[1]
    deps = bootstrap(repo)
    try:
        batch = deps.store.batch(batch_id)
        batch.note_drift("2026-01-01T00:00:00.000Z", "an audit-only event, as a tick appends")
        deps.store.save(batch)
        anchor = GitAnchor(repo / ".git/lanes-es/anchored")
        stale_parent = git_out(repo, "rev-parse", ref(batch_id))
        STATS.reset()
        result = anchor_log(anchor, str(repo), batch_id, batch.version,
                            lambda after: deps.store.stored_events(batch_id, after),
                            lambda: load_signer(repo / ".git"))
        assert STATS.spawns == 2  # one read, one fast-import
        assert result is not None and result.size == batch.version and result.attestations == 0
        moved = git_out(repo, "rev-parse", ref(batch_id))
        with pytest.raises(AnchorRefused, match="moved"):
            anchor.write(str(repo), batch_id, stale_parent, {"checkpoint": b"x\n"}, "stale\n")
        assert git_out(repo, "rev-parse", ref(batch_id)) == moved
        assert git_out(repo, "status", "--porcelain") == ""  # no working tree or index touched
    finally:
        deps.store.close()


def store_leaves(repo: Path, batch_id: str) -> list[bytes]:
    from lanes_es.audit.anchor import log_leaves

    found = StoreRows(store_url_of(repo)).query(
        "select originator_id, originator_version, topic, state from {events} where originator_id = ? "
        "order by originator_version", batch_id)
    rows = [StoredEvent(originator_id=row[0], originator_version=row[1], topic=row[2], state=bytes(row[3]))
            for row in found]
    return log_leaves(rows)


def rewrite_ref_history(repo: Path, batch_id: str, index: int, note: str) -> str:
    """The ref's history again, commit `index` (oldest first) holding `note` as its checkpoint, every
    commit after it re-parented: what someone holding the key would write. The replaced commit's id."""
    commits = git_out(repo, "rev-list", "--reverse", ref(batch_id)).splitlines()
    parent, replaced = None, ""
    for position, commit in enumerate(commits):
        tree = git_out(repo, "rev-parse", f"{commit}^{{tree}}")
        if position == index:
            blob = subprocess.run(["git", "hash-object", "-w", "--stdin"], cwd=repo, input=note.encode(),
                                  capture_output=True, check=True).stdout.decode().strip()
            entries = [line if not line.endswith("\tcheckpoint") else f"100644 blob {blob}\tcheckpoint"
                       for line in git_out(repo, "ls-tree", commit).splitlines()]
            tree = subprocess.run(["git", "mktree"], cwd=repo, input=("\n".join(entries) + "\n").encode(),
                                  capture_output=True, check=True).stdout.decode().strip()
        message = git_out(repo, "log", "-1", "--format=%B", commit)
        parent = git_out(repo, "commit-tree", tree, *(["-p", parent] if parent else []), "-m", message)
        if position == index:
            replaced = parent
    run_git(repo, "update-ref", ref(batch_id), parent or "")
    return replaced


def signed(repo: Path, batch_id: str, size: int, root: bytes) -> str:
    from lanes_es.adapters.signing_key import load_signer
    from lanes_es.audit.signed_note import Checkpoint

    return Checkpoint(batch_id, size, root).sign(load_signer(repo / ".git"))


def test_a_ref_whose_older_checkpoint_was_replaced_by_one_over_another_log_is_found(demo, tmp_path, capsys):
    from lanes_es.audit import merkle

    repo = copy_of(demo, tmp_path)
    batch_id = demo[1]
    commits = git_out(repo, "rev-list", "--reverse", ref(batch_id)).splitlines()
    middle = len(commits) // 2
    size = int(git_out(repo, "show", f"{commits[middle]}:checkpoint").splitlines()[1])
    other_log = store_leaves(repo, batch_id)[:size]
    other_log[1] = merkle.leaf_hash(b"an event that never was")
    replaced = rewrite_ref_history(repo, batch_id, middle, signed(repo, batch_id, size, merkle.root_of(other_log)))
    code, out = cli(capsys, repo, "verify", batch_id)
    assert code == 1, out
    findings = [line for line in out.splitlines() if "checkpoint_inconsistent" in line]
    assert len(findings) == 1, out
    assert f"checkpoint commit {replaced[:12]} ({middle + 1} of {len(commits)} on the ref) signs {size} events" in findings[0]
    assert "checkpoint_root_mismatch" not in out and "log_cut_short" not in out  # the newest still holds the log


def test_a_ref_whose_checkpoint_sizes_shrink_is_found(demo, tmp_path, capsys):
    from lanes_es.audit import merkle

    repo = copy_of(demo, tmp_path)
    batch_id = demo[1]
    commits = git_out(repo, "rev-list", "--reverse", ref(batch_id)).splitlines()
    before = int(git_out(repo, "show", f"{commits[1]}:checkpoint").splitlines()[1])
    leaves = store_leaves(repo, batch_id)[:before - 1]  # the true log, one event short of the one before
    replaced = rewrite_ref_history(repo, batch_id, 2, signed(repo, batch_id, before - 1, merkle.root_of(leaves)))
    code, out = cli(capsys, repo, "verify", batch_id)
    assert code == 1, out
    assert (f"checkpoint_size_decreased: checkpoint commit {replaced[:12]} (3 of {len(commits)} on the ref) signs "
            f"{before - 1} events after commit") in out
    assert "checkpoint_inconsistent" not in out  # a prefix of the true log: consistent, only out of order


def test_an_untouched_ref_history_verifies_every_checkpoint(demo, tmp_path, capsys):
    """Each checkpoint commit of the demo is checked and holds: the same verify with one of them signed by
    another key is a finding naming that commit."""
    from lanes_es.audit.signed_note import Checkpoint
    from lanes_es.audit.signing import Signer

    repo = copy_of(demo, tmp_path)
    batch_id = demo[1]
    code, out = cli(capsys, repo, "verify", batch_id)
    assert code == 0 and "checkpoint_" not in out, out
    commits = git_out(repo, "rev-list", "--reverse", ref(batch_id)).splitlines()
    note = Checkpoint.read_unverified(git_out(repo, "show", f"{commits[0]}:checkpoint") + "\n")
    forged = Checkpoint(batch_id, note.size, note.root).sign(Signer.generate("lanes-es"))
    replaced = rewrite_ref_history(repo, batch_id, 0, forged)
    code, out = cli(capsys, repo, "verify", batch_id)
    assert code == 1, out
    assert f"checkpoint_history_signature: checkpoint commit {replaced[:12]} (1 of {len(commits)} on the ref)" in out


def test_events_saved_by_a_tick_that_died_before_its_checkpoint_are_a_note_until_the_next_tick(demo, tmp_path,
                                                                                                capsys):
    """The store holds events no checkpoint covers, and this machine's kept state is the ref's: the next
    tick anchors them from that state (reading only the events after it)."""
    from lanes_es.bootstrap import bootstrap

    repo = copy_in_place(demo, tmp_path)
    batch_id = demo[1]
    signed_size = int(git_out(repo, "show", f"{ref(batch_id)}:checkpoint").splitlines()[1])
    deps = bootstrap(repo)
    try:
        batch = deps.store.batch(batch_id)
        for _ in range(2):
            batch.note_drift("2026-01-01T00:00:00.000Z", "events of a tick killed before its checkpoint")
        deps.store.save(batch)
    finally:
        deps.store.close()
    code, out = cli(capsys, repo, "verify", batch_id)
    assert code == 0, out
    assert f"note: checkpoint behind by 2 events (it covers {signed_size} of {signed_size + 2}" in out
    cli(capsys, repo, "tick", "demo")
    assert git_out(repo, "show", f"{ref(batch_id)}:checkpoint").splitlines()[1] == str(signed_size + 2)
    code, out = cli(capsys, repo, "verify", batch_id)
    assert code == 0 and "note: checkpoint behind" not in out, out
