"""The audit pair: a settled task's final record and its terminal proof (tombstone v2).

A completed task leaves two tracked files under `.imm/audit/<task>/<run>/`: the task
record as 2-space JSON plus a newline, and a tombstone whose `final_record_hash` is the
sha256 of exactly those bytes. The lane commit carries the pair to the batch branch, where
release and the completion verifier read it, so the format is upstream's to the byte
(docs/upstream.md#the-audit-pair, #the-completion-verifier). Pure: bytes in, bytes or reasons out.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Mapping

from .ids import is_canonical_timestamp, is_valid_id
from .jstext import escape_lone_surrogates, parse_json

TASK_RECORD_CONTRACT = "assurance_kernel/task_record/v4"
TOMBSTONE_CONTRACT = "assurance_kernel/task_tombstone/v2"
TOMBSTONE_KEYS = frozenset({"contract", "task_id", "lifecycle_status", "terminal_lifecycle", "terminal_event_id",
                            "final_record_hash", "terminalized_at"})
TERMINAL_LIFECYCLES = ("done", "stopped")
RUN_ID_PATTERN = re.compile(r"^run-[A-Za-z0-9-]+$")
AUDIT_DIR = ".imm/audit"
RECORD_FILE = "task-record.json"
PROOF_FILE = "terminal-proof.json"
COMPLETE_FROM_STATE = "active:frozen"
COMPLETE_TO_STATE = "done:frozen"


def canonical_bytes(document: Any) -> bytes:
    """Upstream's file form: `JSON.stringify(x, null, 2) + "\\n"` (keys in insertion order, UTF-8 kept,
    a lone surrogate escaped as JavaScript writes it)."""
    return escape_lone_surrogates(json.dumps(document, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def task_record_bytes(record: Mapping[str, Any]) -> bytes:
    """The task-record.json bytes: the record as 2-space JSON plus a newline."""
    return canonical_bytes(record)


def record_hash(record_bytes: bytes) -> str:
    return "sha256:" + hashlib.sha256(record_bytes).hexdigest()


def terminal_event_id(operation: str, task_id: str, at: str) -> str:
    """`<op>:<task_id>:<at>`, for example `complete:task-a:2026-01-01T00:00:00.000Z`."""
    return f"{operation}:{task_id}:{at}"


def tombstone(task_id: str, record_bytes: bytes, terminal_event_id: str, terminalized_at: str,
              terminal_lifecycle: str = "done") -> dict[str, Any]:
    """The terminal proof of `record_bytes`, keys in upstream's order."""
    if terminal_lifecycle not in TERMINAL_LIFECYCLES:
        raise ValueError(f"terminal_lifecycle must be done or stopped, not {terminal_lifecycle!r}")
    return {
        "contract": TOMBSTONE_CONTRACT,
        "task_id": task_id,
        "lifecycle_status": "terminal",
        "terminal_lifecycle": terminal_lifecycle,
        "terminal_event_id": terminal_event_id,
        "final_record_hash": record_hash(record_bytes),
        "terminalized_at": terminalized_at,
    }


def audit_paths(task_id: str, run_id: str) -> tuple[str, str]:
    """The repository-relative paths of the pair: (task-record.json, terminal-proof.json)."""
    if not is_valid_id(task_id):
        raise ValueError(f"invalid task id {task_id!r}")
    if RUN_ID_PATTERN.fullmatch(run_id) is None:
        raise ValueError(f"invalid run id {run_id!r}: expected run-<id>")
    directory = f"{AUDIT_DIR}/{task_id}/{run_id}"
    return f"{directory}/{RECORD_FILE}", f"{directory}/{PROOF_FILE}"


def normalize_tombstone(proof: Mapping[str, Any]) -> dict[str, Any]:
    """A v1 tombstone (`terminal_phase`) read as v2; a v2 one unchanged."""
    if "terminal_phase" in proof and "terminal_lifecycle" not in proof:
        converted = {key: value for key, value in proof.items() if key != "terminal_phase"}
        converted["terminal_lifecycle"] = proof["terminal_phase"]
        converted["contract"] = TOMBSTONE_CONTRACT
        return converted
    return dict(proof)


def tombstone_problem(task_id: str, proof: Any) -> str | None:
    """Why `proof` is not a well-formed terminal proof for `task_id`, or None."""
    if not isinstance(proof, dict):
        return "terminal proof is not a JSON object"
    proof = normalize_tombstone(proof)
    if proof.get("contract") != TOMBSTONE_CONTRACT:
        return f"terminal proof contract must equal {TOMBSTONE_CONTRACT}"
    keys = set(proof)
    if keys != TOMBSTONE_KEYS:
        extra, missing = sorted(keys - TOMBSTONE_KEYS), sorted(TOMBSTONE_KEYS - keys)
        return f"terminal proof has unknown fields {extra} or misses {missing}"
    if proof["task_id"] != task_id:
        return "audit task id mismatch"
    if proof["lifecycle_status"] != "terminal":
        return "terminal proof lifecycle_status is not terminal"
    if proof["terminal_lifecycle"] not in TERMINAL_LIFECYCLES:
        return "terminal proof terminal_lifecycle is not done or stopped"
    if not isinstance(proof["final_record_hash"], str) or re.fullmatch(r"sha256:[0-9a-f]{64}",
                                                                        proof["final_record_hash"]) is None:
        return "terminal proof final_record_hash is not sha256:<64 hex>"
    if not is_canonical_timestamp(proof["terminalized_at"]):
        return "terminal proof terminalized_at is not a canonical timestamp"
    if not isinstance(proof["terminal_event_id"], str) or not proof["terminal_event_id"]:
        return "terminal proof terminal_event_id is empty"
    return None


def verify_pair(task_id: str, record_bytes: bytes, proof_bytes: bytes) -> str | None:
    """None when the pair is a done, self-consistent settlement of `task_id`; else the reason.

    The checks of the completion verifier (docs/upstream.md#the-completion-verifier item 6): the record names the task and is
    done, the proof is a done tombstone v2 whose hash is that of the record bytes, and the
    terminal event is the record's final `complete` transition.
    """
    try:
        record = parse_json(record_bytes.decode("utf-8"))
        proof = parse_json(proof_bytes.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        return f"audit pair is not valid JSON: {error}"
    if not isinstance(record, dict):
        return "task record is not a JSON object"
    if record.get("contract") != TASK_RECORD_CONTRACT:
        return f"task record contract must equal {TASK_RECORD_CONTRACT}"
    if record.get("task_id") != task_id:
        return "audit task id mismatch"
    problem = tombstone_problem(task_id, proof)
    if problem is not None:
        return problem
    proof = normalize_tombstone(proof)
    if proof["final_record_hash"] != record_hash(record_bytes):
        return "terminal proof final_record_hash does not match the task record bytes"
    if proof["terminal_lifecycle"] != "done":
        return "terminal proof lifecycle is not done"
    if record.get("lifecycle") != "done":
        return f"task record lifecycle is {record.get('lifecycle')}"
    return _complete_event_problem(task_id, record, proof)


def _complete_event_problem(task_id: str, record: dict[str, Any], proof: dict[str, Any]) -> str | None:
    """The record's last history entry must be the completion the proof names."""
    history = record.get("history")
    last = history[-1] if isinstance(history, list) and history else None
    if not isinstance(last, dict) or last.get("type") != "complete":
        return "task record does not end with a complete event"
    if last.get("from_state") != COMPLETE_FROM_STATE or last.get("to_state") != COMPLETE_TO_STATE:
        return f"complete event must go from {COMPLETE_FROM_STATE} to {COMPLETE_TO_STATE}"
    if proof["terminal_event_id"] != terminal_event_id("complete", task_id, str(last.get("at"))):
        return "terminal_event_id does not name the record's complete event"
    if proof["terminalized_at"] != last.get("at"):
        return "terminalized_at does not match the record's complete event"
    return None
