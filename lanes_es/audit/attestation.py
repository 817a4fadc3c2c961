"""An in-toto Statement v1 for each integration, and the batch summary (pure).

The facts come from the log: the batch, the task, its Lane and lane commit, the plan
digest and the authorization in force when the child was integrated. Git adds what the
log does not hold: the tree of the integrated commit and the task's acceptance items as
the intent on that commit states them. The integrated commit is the guarded candidate
itself (the batch branch only fast-forwards to a verified candidate), so the candidate's
verdict is the integration guard's: every acceptance item passed on the candidate tree.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from lanes_es.domain import events as ev

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
INTEGRATION_PREDICATE = "urn:lanes-es:predicate:integration:v1"
SUMMARY_PREDICATE = "urn:lanes-es:predicate:batch-summary:v1"
ATTESTATION_DIR = "attestations"
SUMMARY_PATH = "summary.dsse.json"
CHECKPOINT_PATH = "checkpoint"


@dataclass
class IntegrationFact:
    """One Integrated event with the facts of the log as they stood when it was recorded."""

    version: int
    at: str
    batch_id: str
    slug: str
    branch: str
    task_id: str
    commit: str
    parent: str
    adopted: bool
    plan_digest: str
    authorization: dict[str, Any]
    lane: dict[str, Any] | None
    run_id: str | None
    lane_commit: str | None
    intent: dict[str, Any] | None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def path(self) -> str:
        return f"{ATTESTATION_DIR}/{self.version:06d}-{self.task_id}.dsse.json"


def integration_facts(events: Iterable[Any]) -> list[IntegrationFact]:
    """Every integration of the log, oldest first, with the facts each one carried."""
    facts: list[IntegrationFact] = []
    prepared: ev.BatchPrepared | None = None
    plan_digest, confirmation_time, head = "", "", ""
    lanes: dict[str, dict[str, Any]] = {}
    runs: dict[str, str] = {}
    lane_commits: dict[str, str] = {}
    intents: dict[str, dict[str, Any]] = {}
    for event in events:
        if isinstance(event, ev.BatchPrepared):
            prepared, plan_digest, confirmation_time, head = (event, event.plan_digest, event.confirmation_time,
                                                              event.base_head)
            intents = {child.task_id: {"path": child.intent_path, "revision": child.intent_revision,
                                       "content_hash": child.intent_content_hash} for child in event.children}
        elif isinstance(event, ev.Resealed):
            plan_digest = event.to_digest
            intents.setdefault(event.task_id, {}).update(revision=event.intent_revision,
                                                          content_hash=event.intent_content_hash)
        elif isinstance(event, ev.DelegatedRevisionApplied):
            intents.setdefault(event.task_id, {}).update(revision=event.to_revision,
                                                          content_hash=event.intent_content_hash)
        elif isinstance(event, ev.ParkResumed):
            confirmation_time = event.confirmation_time
        elif isinstance(event, ev.LaneAdmitted):
            lanes[event.task_id] = event.lane.plain()
        elif isinstance(event, ev.Enrolled):
            runs[event.task_id] = event.run_id
        elif isinstance(event, ev.LaneCommitted):
            lane_commits[event.task_id] = event.lane_commit
        elif isinstance(event, ev.HeadAdopted):
            head = event.to_head
        elif isinstance(event, ev.Integrated) and prepared is not None:
            facts.append(IntegrationFact(
                version=event.originator_version, at=event.at, batch_id=prepared.batch_id,
                slug=prepared.initiative_slug, branch=prepared.branch, task_id=event.task_id, commit=event.commit,
                parent=head, adopted=event.adopted, plan_digest=plan_digest,
                authorization={"actor": "literal-user", "confirmation_time": confirmation_time,
                               "base_head": prepared.base_head, "max_parallel": prepared.max_parallel,
                               "budget": prepared.budget.plain()},
                lane=lanes.get(event.task_id), run_id=runs.get(event.task_id),
                lane_commit=lane_commits.get(event.task_id), intent=dict(intents.get(event.task_id) or {}) or None))
            head = event.commit
    return facts


def acceptance_items(intent_bytes: bytes | None) -> list[dict[str, Any]]:
    """Each acceptance item of the intent on the integrated commit, with the guard's verdict.

    Output digests are not recorded in the log by this version, so each says so (null)."""
    if intent_bytes is None:
        return []
    try:
        items = json.loads(intent_bytes).get("acceptance") or []
    except (ValueError, AttributeError):
        return []
    accepted = []
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        command: Any = None
        try:
            descriptor = json.loads(item.get("verification") or "null")
            command = descriptor.get("command") if isinstance(descriptor, dict) else None
        except (TypeError, ValueError):
            command = None
        accepted.append({"id": item.get("id"), "assertion": item.get("assertion"), "command": command,
                         "verdict": "pass", "verdict_source": "integration guard rerun on the candidate tree",
                         "output_digests": None})
    return accepted


def integration_statement(fact: IntegrationFact, tree: str, intent_bytes: bytes | None) -> dict[str, Any]:
    predicate = {
        "batch_id": fact.batch_id,
        "initiative_slug": fact.slug,
        "branch": fact.branch,
        "task_id": fact.task_id,
        "event_version": fact.version,
        "integrated_at": fact.at,
        "adopted": fact.adopted,
        "lane": fact.lane,
        "run_id": fact.run_id,
        "lane_commit": fact.lane_commit,
        "candidate": {"commit": fact.commit, "tree": tree, "parent": fact.parent},
        "plan_digest": fact.plan_digest,
        "authorization": fact.authorization,
        "intent": {**(fact.intent or {}),
                   "sha256_on_candidate": hashlib.sha256(intent_bytes).hexdigest() if intent_bytes else None},
        "acceptance": acceptance_items(intent_bytes),
        **fact.extra,
    }
    return {"_type": STATEMENT_TYPE,
            "subject": [{"name": f"{fact.branch}@{fact.task_id}", "digest": {"gitCommit": fact.commit}},
                        {"name": f"{fact.branch}@{fact.task_id}^{{tree}}", "digest": {"gitTree": tree}}],
            "predicateType": INTEGRATION_PREDICATE, "predicate": predicate}


def summary_statement(batch_id: str, batch_state: str, size: int, root_hex: str,
                      facts: Sequence[IntegrationFact]) -> dict[str, Any]:
    """The batch at completion: every integrated commit, and where its attestation lives."""
    return {"_type": STATEMENT_TYPE,
            "subject": [{"name": f"{fact.branch}@{fact.task_id}", "digest": {"gitCommit": fact.commit}}
                        for fact in facts],
            "predicateType": SUMMARY_PREDICATE,
            "predicate": {"batch_id": batch_id, "batch_state": batch_state,
                          "checkpoint": {"size": size, "root_sha256": root_hex},
                          "attestations": [{"path": fact.path, "task_id": fact.task_id, "commit": fact.commit,
                                            "event_version": fact.version} for fact in facts]}}


def statement_bytes(statement: dict[str, Any]) -> bytes:
    return json.dumps(statement, sort_keys=True, separators=(",", ":")).encode()


def subject_digest(statement: dict[str, Any], kind: str) -> str | None:
    for subject in statement.get("subject") or []:
        digest = subject.get("digest") if isinstance(subject, dict) else None
        if isinstance(digest, dict) and isinstance(digest.get(kind), str):
            return digest[kind]
    return None
