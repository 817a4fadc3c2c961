"""docs/upstream.md#the-steps-of-a-tick: each lane commit integrated onto the batch branch through a guarded candidate."""

from __future__ import annotations

from typing import Any

from lanes_es.domain import events as ev
from lanes_es.domain.candidates import SERIAL
from lanes_es.domain.plan import compute_batch_plan_digest
from lanes_es.domain.record import expected_batch_head
from lanes_es.ports import (
    CandidateCheck, CandidateChecks, CandidateVerdict, IntegrationChild, IntegrationError, IntegrationRequest, Lineage,
    PortError,
)
from lanes_es.tick import rounds, verification
from lanes_es.tick.context import TickContext, TickFinished, is_lineage_break


def integrate_committed(ctx: TickContext) -> None:
    """Serial (upstream's order, one candidate at a time), or a round of candidates (speculative, batched)."""
    children = list(ctx.live.children_in("lane_committed"))
    if children and (ctx.live.flake_reruns or (ctx.live.integration != SERIAL and len(children) > 1)):
        rounds.integrate_round(ctx, children)
        return
    integrate_serially(ctx, children)


def integrate_serially(ctx: TickContext, children: list[dict[str, Any]]) -> None:
    for child in children:
        task_id = child["task_id"]
        checks: list[CandidateCheck] = []

        def verify(planned: CandidateChecks, lanes: list[str] = [task_id]) -> CandidateVerdict:
            return verification.verify_now(ctx, planned, lanes)  # concurrently, bounded by verify_workers

        try:
            commit = ctx.ports.candidates.integrate(integration_request(ctx, child), checks, verify=verify)
        except PortError as error:
            park_failed_integration(ctx, task_id, error)
            continue
        record_integration(ctx, task_id, commit, [check_verdict(check) for check in checks])


def integration_request(ctx: TickContext, child: dict[str, Any], on: str | None = None,
                        ahead: list[IntegrationChild] | None = None) -> IntegrationRequest:
    """The guarded integration of `child` on the batch head (or on the candidate `on`, carrying `ahead`)."""
    task_id, lane = child["task_id"], child["lane"]
    siblings = [IntegrationChild(task_id=c["task_id"], intent_path=ctx.intent_path_of(c["task_id"]),
                                 commit=c["commit"])
                # Released siblings too (upstream drops them): the rerun set must not depend on when a
                # steward removed a Lane.
                for c in ctx.live.children_in("integrated", "released") if c["task_id"] != task_id]
    known = {sibling.task_id for sibling in siblings}
    siblings += [sibling for sibling in ahead or [] if sibling.task_id not in known]
    return IntegrationRequest(
        root=ctx.tick.root, branch=ctx.record["branch"], batch_head=on or expected_batch_head(ctx.record),
        lane_base=lane["base_head"], lane_commit=lane["lane_commit"],
        child=IntegrationChild(task_id=task_id, intent_path=ctx.intent_path_of(task_id)), siblings=siblings)


def check_verdict(check: CandidateCheck) -> ev.CheckVerdict:
    """A task's rerun on a candidate as the log records it."""
    return ev.CheckVerdict(task_id=check.task_id, passed=not check.findings and not check.cancelled,
                           findings=list(check.findings), attempts=check.attempts, flaky=list(check.flaky),
                           outputs=list(check.outputs), tree=check.tree, acceptance=check.acceptance,
                           reused_from=check.reused_from, cancelled=check.cancelled, covered_by=check.covered_by)


def record_integration(ctx: TickContext, task_id: str, commit: str, checks: list[ev.CheckVerdict] | None = None) -> None:
    """`checks`: the serial guard's rerun (a round recorded its verdicts on CandidateVerified already)."""
    ctx.live.integrate(ctx.now, task_id, commit, checks=checks)
    ctx.persist()
    ctx.lineage = Lineage(kind="equal", head=commit)  # our own fast-forward
    ctx.scopes.clear()
    reseal_delegated_revision(ctx, task_id)


def park_failed_integration(ctx: TickContext, task_id: str, error: PortError) -> None:
    """Park with serial's reason; a candidate whose checks failed is kept under a ref (`failed_candidate_ref`)
    and its failed checks, with their output tails, go on the Parked event."""
    message = str(error)
    code = error.reason if isinstance(error, IntegrationError) else "batch_integration_conflict"
    reason = message if is_lineage_break(message) or message.startswith(f"{code}:") else f"{code}: {message}"
    candidate = error.candidate if isinstance(error, IntegrationError) else None
    ref = None
    if candidate:
        ref = ctx.ports.candidates.keep_candidate(ctx.tick.root, failed_candidate_ref(ctx.record["batch_id"], task_id),
                                                  candidate)
    failed = [check_verdict(check) for check in error.checks if check.findings and not check.cancelled] \
        if isinstance(error, IntegrationError) else []
    ctx.park_child(task_id, reason, candidate=candidate, candidate_ref=ref, failed_checks=failed)
    if is_lineage_break(message):
        raise TickFinished(ctx.fail_lineage(message))
    # The batch branch is unmoved; a disjoint sibling may still integrate.


def failed_candidate_ref(batch_id: str, task_id: str) -> str:
    """Where a Lane's failed candidate is kept: `git log`, `git diff`, `git worktree add DIR <ref>` show it."""
    return f"refs/lanes-es/failed/{batch_id}/{task_id}"


def reseal_delegated_revision(ctx: TickContext, task_id: str) -> None:
    """docs/upstream.md#delegated-intent-revisions: reseal plan_digest when the integrated intent is the delegated revision."""
    record = ctx.record
    identities = record.get("intent_identities") or {}
    recorded = identities.get(task_id)
    if not recorded:
        return
    try:
        read = ctx.ports.batch_git.read_intent(ctx.tick.root, task_id, recorded["intent_path"])
    except PortError:
        return
    revision, content_hash = read.intent["revision"], read.content_hash
    if revision == recorded["intent_revision"] and content_hash == recorded["intent_content_hash"]:
        return
    delegated = [r for r in record.get("delegated_revisions", []) if r["task_id"] == task_id]
    if not delegated or delegated[-1]["to_revision"] != revision or delegated[-1]["intent_content_hash"] != content_hash:
        return
    if any(child["task_id"] not in identities for child in record["children"]):
        return
    plan = []
    for child in record["children"]:
        identity = identities[child["task_id"]]
        if child["task_id"] == task_id:
            identity = {**identity, "intent_revision": revision, "intent_content_hash": content_hash}
        plan.append(ev.PlanChild(task_id=child["task_id"], slice_id=child["slice_id"],
                                 blocked_by=list(child["blocked_by"]), **identity))
    try:
        to_digest = compute_batch_plan_digest(plan)
    except ValueError:
        return
    ctx.live.reseal(ctx.now, task_id, to_digest, revision, content_hash)
    ctx.persist()
