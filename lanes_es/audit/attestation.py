"""An in-toto Statement v1 for each integration, and the batch summary (pure).

The facts come from the log: the batch, the task, its Lane and lane commit, the plan
digest and the authorization in force when the child was integrated. Git adds what the
log does not hold: the tree of the integrated commit and the task's acceptance items as
the intent on that commit states them. The integrated commit is the guarded candidate
itself (the batch branch only fast-forwards to a verified candidate). Its verdict and each
command's output digest come from the log: the candidate's own `CandidateVerified` (speculative,
batched, a flake policy), or in a batched round the verdict of the candidate built on it that
carried its Lane (then this commit was not verified one by one: `unverified_intermediates`), or
the serial guard's rerun recorded on `Integrated`; an older log recorded none (`recorded: false`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import msgspec

from lanes_es.domain import events as ev
from lanes_es.domain.jstext import parse_json

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
    candidate: dict[str, Any] = field(default_factory=dict)  # how the candidate was built (CandidateBuilt)
    verification: dict[str, Any] = field(default_factory=dict)  # which verdict admitted it, and its checks
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def path(self) -> str:
        return f"{ATTESTATION_DIR}/{self.version:06d}-{self.task_id}.dsse.json"

    def summary_entry(self) -> dict[str, Any]:
        return {"path": self.path, "task_id": self.task_id, "commit": self.commit, "event_version": self.version,
                "branch": self.branch}


class FactsFold(msgspec.Struct, kw_only=True):
    """What the facts of an integration need from the events before it, folded one event at a time.

    Plain JSON values only, so the anchor can keep it beside the size it last anchored and fold
    only the events a tick appended (`lanes_es/audit/anchor.py`)."""

    prepared: dict[str, Any] | None = None
    plan_digest: str = ""
    confirmation_time: str = ""
    head: str = ""
    lanes: dict[str, Any] = {}
    runs: dict[str, str] = {}
    lane_commits: dict[str, str] = {}
    intents: dict[str, dict[str, Any]] = {}
    built: dict[str, dict[str, Any]] = {}  # candidate commit -> its CandidateBuilt
    verified: dict[str, dict[str, Any]] = {}  # candidate commit -> its newest passing CandidateVerified
    integrated: list[dict[str, Any]] = []  # every integration so far, as the summary lists it
    # "<event version>:<task>" -> the command outputs of a passing check there: what a reused verdict points at
    passed_outputs: dict[str, list[dict[str, Any]]] = {}

    def apply(self, event: Any) -> IntegrationFact | None:
        """Fold one event; the facts of the integration it records, if it is one."""
        if isinstance(event, ev.BatchPrepared):
            self.prepared = {"batch_id": event.batch_id, "slug": event.initiative_slug, "branch": event.branch,
                             "base_head": event.base_head, "max_parallel": event.max_parallel,
                             "budget": event.budget.plain()}
            self.plan_digest, self.confirmation_time, self.head = (event.plan_digest, event.confirmation_time,
                                                                   event.base_head)
            self.intents = {child.task_id: {"path": child.intent_path, "revision": child.intent_revision,
                                            "content_hash": child.intent_content_hash} for child in event.children}
        elif isinstance(event, ev.Resealed):
            self.plan_digest = event.to_digest
            self.intents.setdefault(event.task_id, {}).update(revision=event.intent_revision,
                                                               content_hash=event.intent_content_hash)
        elif isinstance(event, ev.DelegatedRevisionApplied):
            self.intents.setdefault(event.task_id, {}).update(revision=event.to_revision,
                                                               content_hash=event.intent_content_hash)
        elif isinstance(event, ev.ParkResumed):
            self.confirmation_time = event.confirmation_time
        elif isinstance(event, ev.LaneAdmitted):
            self.lanes[event.task_id] = event.lane.plain()
        elif isinstance(event, ev.Enrolled):
            self.runs[event.task_id] = event.run_id
        elif isinstance(event, ev.LaneCommitted):
            self.lane_commits[event.task_id] = event.lane_commit
        elif isinstance(event, ev.HeadAdopted):
            self.head = event.to_head
        elif isinstance(event, ev.CandidateBuilt) and event.commit:
            self.built[event.commit] = {"event_version": event.originator_version, "mode": event.mode,
                                        "lanes": list(event.lanes), "parent": event.parent,
                                        "reparented_from": event.reparented_from}
        if isinstance(event, ev.Settled) and event.qa_outputs:
            self.passed_outputs[f"{event.originator_version}:{event.task_id}"] = [o.plain() for o in event.qa_outputs]
        elif isinstance(event, (ev.CandidateVerified, ev.Integrated)):
            for check in event.checks:
                if check.passed and check.outputs:
                    self.passed_outputs[f"{event.originator_version}:{check.task_id}"] = [
                        output.plain() for output in check.outputs]
        if isinstance(event, ev.CandidateVerified) and event.commit and event.passed:
            self.verified[event.commit] = {"event_version": event.originator_version, "mode": event.mode,
                                           "commit": event.commit, "lanes": list(event.lanes),
                                           "bisection": event.bisection,
                                           "unverified_intermediates": list(event.unverified_intermediates),
                                           "checks": [check.plain() for check in event.checks]}
        elif isinstance(event, ev.Integrated) and self.prepared is not None:
            return self._integration(event)
        return None

    def _integration(self, event: ev.Integrated) -> IntegrationFact:
        prepared = self.prepared or {}
        built = self.built.get(event.commit)
        fact = IntegrationFact(
            version=event.originator_version, at=event.at, batch_id=prepared["batch_id"], slug=prepared["slug"],
            branch=prepared["branch"], task_id=event.task_id, commit=event.commit,
            parent=built["parent"] if built else self.head, adopted=event.adopted, plan_digest=self.plan_digest,
            authorization={"actor": "literal-user", "confirmation_time": self.confirmation_time,
                           "base_head": prepared["base_head"], "max_parallel": prepared["max_parallel"],
                           "budget": prepared["budget"]},
            lane=self.lanes.get(event.task_id), run_id=self.runs.get(event.task_id),
            lane_commit=self.lane_commits.get(event.task_id),
            intent=dict(self.intents.get(event.task_id) or {}) or None,
            candidate={"mode": built["mode"], "lanes": built["lanes"], "reparented_from": built["reparented_from"],
                       "built_event_version": built["event_version"]} if built else {"mode": "serial"},
            verification=self._with_reused_outputs(self._verification(event)))
        self.head = event.commit
        self.integrated.append(fact.summary_entry())
        return fact

    def _verification(self, event: ev.Integrated) -> dict[str, Any]:
        """The verdict that let this commit land: its own CandidateVerified; in a batched round, the verdict of
        a candidate built on it that carried this Lane (this commit then was not verified one by one); the
        serial guard's rerun recorded on the Integrated event; or, in an older log, none recorded."""
        own = self.verified.get(event.commit)
        if own is not None:
            return {"source": "CandidateVerified", "verified_commit": event.commit, "verified_directly": True,
                    **own}
        covering = self._covering_verdict(event.task_id, event.commit)
        if covering is not None:
            return {"source": "CandidateVerified", "verified_commit": covering["commit"], "verified_directly": False,
                    **covering}
        if event.checks:
            return {"source": "Integrated", "event_version": event.originator_version, "verified_commit": event.commit,
                    "verified_directly": True,
                    "mode": "serial", "checks": [check.plain() for check in event.checks]}
        return {"source": None, "verified_commit": None, "verified_directly": None, "checks": []}

    def _with_reused_outputs(self, verification: dict[str, Any]) -> dict[str, Any]:
        """A check that reused a verdict on byte-identical inputs ran nothing: its command outputs are those of
        the run it reused (`reused_from`: that event's version)."""
        checks = []
        for check in verification.get("checks") or []:
            reused = check.get("reused_from")
            if reused is not None and not check.get("outputs"):
                check = {**check, "outputs": self.passed_outputs.get(f"{reused}:{check.get('task_id')}", [])}
            checks.append(check)
        return {**verification, "checks": checks} if "checks" in verification else verification

    def _covering_verdict(self, task_id: str, commit: str) -> dict[str, Any] | None:
        """The newest passing verdict naming `task_id` among its unverified intermediates whose candidate is
        built, parent by parent, on `commit`."""
        for verdict in sorted(self.verified.values(), key=lambda found: -found["event_version"]):
            if task_id not in verdict["unverified_intermediates"]:
                continue
            current, seen = verdict["commit"], set()
            while current in self.built and current not in seen:
                seen.add(current)
                current = self.built[current]["parent"]
                if current == commit:
                    return verdict
        return None


def integration_facts(events: Iterable[Any]) -> list[IntegrationFact]:
    """Every integration of the log, oldest first, with the facts each one carried."""
    fold = FactsFold()
    return [fact for fact in (fold.apply(event) for event in events) if fact is not None]


def acceptance_items(intent_bytes: bytes | None, task_id: str = "",
                     verification: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Each acceptance item of the intent on the integrated commit, with its verdict and output digest from
    the verification that admitted the commit (`output_digests` null where the log recorded none)."""
    if intent_bytes is None:
        return []
    try:
        items = parse_json(intent_bytes.decode("utf-8")).get("acceptance") or []
    except (ValueError, AttributeError):
        return []
    verification = verification or {}
    outputs = {output.get("id"): output for check in verification.get("checks") or []
               if check.get("task_id") == task_id for output in check.get("outputs") or []}
    source = _verdict_source(verification)
    reused = next((check.get("reused_from") for check in verification.get("checks") or []
                   if check.get("task_id") == task_id and check.get("reused_from") is not None), None)
    if reused is not None:
        source += f"; the check was not run again: it had passed on byte-identical inputs (event {reused})"
    covered = next((check.get("covered_by") for check in verification.get("checks") or []
                    if check.get("task_id") == task_id and check.get("covered_by")), None)
    if covered is not None:
        source += (f"; the check was not run on this candidate: it passed on candidate {covered}, which carries "
                   f"this candidate's Lanes and more")
    accepted = []
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        command: Any = None
        try:
            descriptor = parse_json(item.get("verification") or "null")
            command = descriptor.get("command") if isinstance(descriptor, dict) else None
        except (TypeError, ValueError):
            command = None
        output = outputs.get(f"{task_id}:{item.get('id')}")
        accepted.append({"id": item.get("id"), "assertion": item.get("assertion"), "command": command,
                         "verdict": "pass" if output is None or output.get("passed") else "fail",
                         "verdict_source": source,
                         "output_digests": None if output is None or output.get("output_sha256") is None else
                         {"sha256": output["output_sha256"], "bytes": output.get("output_bytes", 0),
                          "streams": "stdout+stderr"}})
    return accepted


def _verdict_source(verification: dict[str, Any]) -> str:
    if verification.get("source") is None:
        return "integration guard rerun on the candidate tree (not recorded item by item in this log)"
    if verification.get("verified_directly"):
        return f"integration guard rerun on the candidate tree ({verification['source']})"
    return (f"batched: verified on candidate {verification['verified_commit']}, built on this commit and "
            f"carrying this Lane; this commit itself was not verified one by one")


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
        "candidate": {"commit": fact.commit, "tree": tree, "parent": fact.parent, **fact.candidate},
        "verification": _verification_predicate(fact.verification),
        "plan_digest": fact.plan_digest,
        "authorization": fact.authorization,
        "intent": {**(fact.intent or {}),
                   "sha256_on_candidate": hashlib.sha256(intent_bytes).hexdigest() if intent_bytes else None},
        "acceptance": acceptance_items(intent_bytes, fact.task_id, fact.verification),
        **fact.extra,
    }
    return {"_type": STATEMENT_TYPE,
            "subject": [{"name": f"{fact.branch}@{fact.task_id}", "digest": {"gitCommit": fact.commit}},
                        {"name": f"{fact.branch}@{fact.task_id}^{{tree}}", "digest": {"gitTree": tree}}],
            "predicateType": INTEGRATION_PREDICATE, "predicate": predicate}


def _verification_predicate(verification: dict[str, Any]) -> dict[str, Any]:
    """Which verdict admitted the candidate: its event, the commit the checks ran on, every task's checks
    (findings, attempts, flaky, output digests) and, for a batched round, the Lanes whose own candidates
    were not verified one by one (`unverified_intermediates`)."""
    if verification.get("source") is None:
        return {"recorded": False, "checks": []}
    return {"recorded": True, "event": verification["source"], "event_version": verification.get("event_version"),
            "mode": verification.get("mode"), "verified_commit": verification["verified_commit"],
            "verified_directly": verification["verified_directly"], "bisection": verification.get("bisection", False),
            "unverified_intermediates": verification.get("unverified_intermediates", []),
            "checks": verification.get("checks", [])}


def summary_statement(batch_id: str, batch_state: str, size: int, root_hex: str,
                      integrated: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The batch at completion: every integrated commit (`IntegrationFact.summary_entry`), and where its
    attestation lives."""
    return {"_type": STATEMENT_TYPE,
            "subject": [{"name": f"{entry['branch']}@{entry['task_id']}", "digest": {"gitCommit": entry["commit"]}}
                        for entry in integrated],
            "predicateType": SUMMARY_PREDICATE,
            "predicate": {"batch_id": batch_id, "batch_state": batch_state,
                          "checkpoint": {"size": size, "root_sha256": root_hex},
                          "attestations": [{"path": entry["path"], "task_id": entry["task_id"],
                                            "commit": entry["commit"], "event_version": entry["event_version"]}
                                           for entry in integrated]}}


def statement_bytes(statement: dict[str, Any]) -> bytes:
    return json.dumps(statement, sort_keys=True, separators=(",", ":")).encode()


def subject_digest(statement: dict[str, Any], kind: str) -> str | None:
    for subject in statement.get("subject") or []:
        digest = subject.get("digest") if isinstance(subject, dict) else None
        if isinstance(digest, dict) and isinstance(digest.get(kind), str):
            return digest[kind]
    return None
