"""What an integration's attestation says about its verdict (issue 13): each acceptance command with
its verdict and the sha256 of its output, taken from the events that recorded the Lane QA and the
candidate checks; for a batched round, that the intermediate commits were not verified one by one.
Real git, the real kernel and QA runner, on SQLite and on PostgreSQL."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from lanes_es.domain import events as ev
from tests.engine import Engine, Task
from tests.gitfixtures import descriptor, git_out

pytestmark = pytest.mark.usefixtures("store_url")


def printing(text: str) -> str:
    """A check that passes and writes `text` on stdout and `!` on stderr."""
    return descriptor(["-c", f"import sys; sys.stdout.write({text!r}); sys.stdout.flush(); sys.stderr.write('!')"])


def output_digest(text: str) -> str:
    return hashlib.sha256(text.encode() + b"!").hexdigest()


TASKS = {task_id: Task([f"{task_id}.txt"], verification=printing(f"out of {task_id}\n")) for task_id in ("t0", "t1", "t2")}


def run_round(tmp_path: Path, mode: str) -> Engine:
    engine = Engine.create(tmp_path / mode, TASKS)
    engine.authorize(max_parallel=len(TASKS), integration=mode, verify_workers=2)
    report = engine.tick()
    engine.tick(offers={task_id: engine.provision(task_id, report) for task_id in TASKS})
    for task_id in TASKS:
        engine.deliver(task_id, f"{task_id}.txt", f"{task_id}\n")
    report = engine.tick()
    assert [child["state"] for child in report["children"]] == ["integrated"] * len(TASKS), report
    return engine


def attestations(engine: Engine) -> dict[str, dict[str, Any]]:
    """task id -> the predicate of its integration's attestation, as a verifier reads it from the ref."""
    ref = f"refs/lanes-es/checkpoints/{engine.batch.id}"
    found = {}
    for path in git_out(engine.root, "ls-tree", "-r", "--name-only", ref).splitlines():
        if path.startswith("attestations/"):
            envelope = json.loads(git_out(engine.root, "show", f"{ref}:{path}"))
            predicate = json.loads(base64.b64decode(envelope["payload"]))["predicate"]
            found[predicate["task_id"]] = predicate
    return found


def recorded(engine: Engine, kind: type, key: str) -> dict[str, Any]:
    """The events of `kind` in the batch's log, by `key` (a later one wins)."""
    return {getattr(event, key): event for event in engine.deps.store.events(engine.batch.id)
            if isinstance(event, kind)}


def own_output(predicate: dict[str, Any]) -> dict[str, Any]:
    [item] = predicate["acceptance"]
    return item


def test_serial_attests_each_command_with_the_digest_of_its_output_on_the_candidate(tmp_path):
    engine = run_round(tmp_path, "serial")
    try:
        predicates = attestations(engine)
        integrated, settled = recorded(engine, ev.Integrated, "task_id"), recorded(engine, ev.Settled, "task_id")
    finally:
        engine.deps.store.close()
    assert sorted(predicates) == list(TASKS)
    for task_id, predicate in predicates.items():
        digest = output_digest(f"out of {task_id}\n")
        item = own_output(predicate)
        assert item["verdict"] == "pass"
        assert item["output_digests"] == {"sha256": digest, "bytes": len(f"out of {task_id}\n") + 1,
                                          "streams": "stdout+stderr"}
        verification = predicate["verification"]
        assert (verification["event"], verification["event_version"]) == ("Integrated",
                                                                          integrated[task_id].originator_version)
        assert verification["verified_commit"] == predicate["candidate"]["commit"] == integrated[task_id].commit
        # the serial guard reran every sibling landed since the Lane's base: each with its own digest
        assert {check["task_id"] for check in verification["checks"]} == {t for t in TASKS if t <= task_id}
        # the Lane QA's verdict carries the same command's digest on the Lane's tree
        assert [(output.id, output.passed, output.output_sha256) for output in settled[task_id].qa_outputs] == [
            (f"{task_id}:A1", True, digest)]


def test_speculative_attests_the_verdict_of_each_integrated_candidate(tmp_path):
    engine = run_round(tmp_path, "speculative")
    try:
        predicates = attestations(engine)
        verified = recorded(engine, ev.CandidateVerified, "commit")
    finally:
        engine.deps.store.close()
    for task_id, predicate in predicates.items():
        commit = predicate["candidate"]["commit"]
        verification = predicate["verification"]
        assert verification["event"] == "CandidateVerified" and verification["verified_directly"] is True
        assert verification["event_version"] == verified[commit].originator_version
        assert predicate["candidate"]["mode"] == "speculative"
        assert predicate["candidate"]["lanes"] == list(TASKS)[:list(TASKS).index(task_id) + 1]
        assert own_output(predicate)["output_digests"]["sha256"] == output_digest(f"out of {task_id}\n")


def test_a_batched_round_says_its_intermediate_commits_were_not_verified_one_by_one(tmp_path):
    engine = run_round(tmp_path, "batched")
    try:
        predicates = attestations(engine)
        [verdict] = recorded(engine, ev.CandidateVerified, "commit").values()
    finally:
        engine.deps.store.close()
    assert verdict.unverified_intermediates == ["t0", "t1"]
    top = predicates["t2"]["candidate"]["commit"]
    assert verdict.commit == top
    for task_id in ("t0", "t1"):
        verification = predicates[task_id]["verification"]
        assert verification["verified_directly"] is False and verification["verified_commit"] == top
        assert verification["unverified_intermediates"] == ["t0", "t1"]
        item = own_output(predicates[task_id])
        assert "was not verified one by one" in item["verdict_source"] and top in item["verdict_source"]
        assert item["output_digests"]["sha256"] == output_digest(f"out of {task_id}\n")  # its checks, on the top
    assert predicates["t2"]["verification"]["verified_directly"] is True
