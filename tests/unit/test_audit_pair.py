"""The audit pair format: record bytes, tombstone v2, verification and paths (docs/upstream.md#the-audit-pair, #the-completion-verifier)."""

from __future__ import annotations

import hashlib
import json

import pytest

from lanes_es.domain.audit_pair import (
    audit_paths,
    normalize_tombstone,
    task_record_bytes,
    terminal_event_id,
    tombstone,
    verify_pair,
)

AT = "2026-03-01T10:00:00.000Z"


def done_record(task_id: str = "task-a", at: str = AT) -> dict:
    return {
        "contract": "assurance_kernel/task_record/v4",
        "task_id": task_id,
        "run_id": "run-0f1e2d3c-0000-4000-8000-000000000001",
        "record_revision": 4,
        "lifecycle": "done",
        "artifact_state": "frozen",
        "history": [
            {"type": "enroll", "at": "2026-03-01T09:00:00.000Z", "from_state": "none", "to_state": "active:active"},
            {"type": "complete", "at": at, "from_state": "active:frozen", "to_state": "done:frozen"},
        ],
    }


def make_pair(record: dict) -> tuple[bytes, bytes]:
    record_bytes = task_record_bytes(record)
    last = record["history"][-1]["at"]
    proof = tombstone(record["task_id"], record_bytes, terminal_event_id("complete", record["task_id"], last), last)
    return record_bytes, task_record_bytes(proof)


def test_record_bytes_are_two_space_json_with_a_newline_in_key_order():
    data = task_record_bytes({"b": 1, "a": [], "c": {"x": "é"}})
    assert data == '{\n  "b": 1,\n  "a": [],\n  "c": {\n    "x": "é"\n  }\n}\n'.encode()


def test_tombstone_has_exactly_upstreams_keys_in_order_and_hashes_the_record_bytes():
    record_bytes = task_record_bytes(done_record())
    proof = tombstone("task-a", record_bytes, f"complete:task-a:{AT}", AT)
    assert list(proof) == ["contract", "task_id", "lifecycle_status", "terminal_lifecycle", "terminal_event_id",
                           "final_record_hash", "terminalized_at"]
    assert proof["contract"] == "assurance_kernel/task_tombstone/v2"
    assert proof["lifecycle_status"] == "terminal"
    assert proof["terminal_lifecycle"] == "done"
    assert proof["final_record_hash"] == "sha256:" + hashlib.sha256(record_bytes).hexdigest()


def test_tombstone_refuses_a_non_terminal_lifecycle():
    with pytest.raises(ValueError):
        tombstone("task-a", b"{}\n", "x", AT, terminal_lifecycle="active")


def test_a_consistent_done_pair_verifies():
    record_bytes, proof_bytes = make_pair(done_record())
    assert verify_pair("task-a", record_bytes, proof_bytes) is None


def test_a_tampered_record_fails_the_hash():
    record_bytes, proof_bytes = make_pair(done_record())
    assert verify_pair("task-a", record_bytes.replace(b'"record_revision": 4', b'"record_revision": 5'),
                       proof_bytes) == "terminal proof final_record_hash does not match the task record bytes"


def test_a_pair_for_another_task_is_an_id_mismatch():
    record_bytes, proof_bytes = make_pair(done_record("task-b"))
    assert verify_pair("task-a", record_bytes, proof_bytes) == "audit task id mismatch"


def test_a_stopped_proof_is_not_a_done_settlement():
    record = done_record()
    record_bytes = task_record_bytes(record)
    proof = tombstone("task-a", record_bytes, f"stop:task-a:{AT}", AT, terminal_lifecycle="stopped")
    assert verify_pair("task-a", record_bytes, task_record_bytes(proof)) == "terminal proof lifecycle is not done"


def test_the_proof_must_name_the_records_complete_event():
    record = done_record()
    record_bytes = task_record_bytes(record)
    proof = tombstone("task-a", record_bytes, "complete:task-a:2026-03-01T11:00:00.000Z", AT)
    assert verify_pair("task-a", record_bytes, task_record_bytes(proof)) == \
        "terminal_event_id does not name the record's complete event"


def test_a_record_not_ending_in_complete_is_refused():
    record = done_record()
    record["history"].append({"type": "note", "at": AT, "from_state": "done:frozen", "to_state": "done:frozen"})
    record_bytes = task_record_bytes(record)
    proof = tombstone("task-a", record_bytes, f"complete:task-a:{AT}", AT)
    assert verify_pair("task-a", record_bytes, task_record_bytes(proof)) == \
        "task record does not end with a complete event"


def test_extra_proof_keys_and_bad_json_are_refused():
    record_bytes, proof_bytes = make_pair(done_record())
    proof = json.loads(proof_bytes)
    proof["note"] = "x"
    assert "unknown fields ['note']" in verify_pair("task-a", record_bytes, task_record_bytes(proof))
    assert verify_pair("task-a", record_bytes, b"{").startswith("audit pair is not valid JSON")


def test_a_v1_tombstone_reads_as_v2():
    proof = {"contract": "assurance_kernel/task_tombstone/v1", "task_id": "t", "lifecycle_status": "terminal",
             "terminal_phase": "done", "terminal_event_id": "e", "final_record_hash": "sha256:" + "0" * 64,
             "terminalized_at": AT}
    normalized = normalize_tombstone(proof)
    assert normalized["terminal_lifecycle"] == "done"
    assert "terminal_phase" not in normalized
    assert normalized["contract"] == "assurance_kernel/task_tombstone/v2"


def test_audit_paths_and_their_checks():
    assert audit_paths("task-a", "run-1") == (".imm/audit/task-a/run-1/task-record.json",
                                               ".imm/audit/task-a/run-1/terminal-proof.json")
    with pytest.raises(ValueError):
        audit_paths("../x", "run-1")
    with pytest.raises(ValueError):
        audit_paths("task-a", "run/../../x")
