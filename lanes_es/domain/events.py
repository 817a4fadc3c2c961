"""The facts of the log: every transition of a batch, and every authorization of an Initiative.

Events are frozen msgspec Structs so that the store can encode them whole, sorted and
compact. Each carries `at`, the tick's `now` as a canonical timestamp (projections
read time from there, never from a clock), and `digest`, the link of the audit
chain: sha256(previous digest + canonical bytes of this event without its digest).

Payloads are typed Structs rather than dicts: a Struct keeps its field order on a
round trip through the sorted encoding, so a report rebuilt from the log has the
same key order, and so the same bytes, as the one written on the live path.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Any, Union

import msgspec
from eventsourcing.domain import CanInitAggregate, CanMutateAggregate

_CANONICAL = msgspec.json.Encoder(order="sorted")


class Payload(msgspec.Struct, frozen=True, kw_only=True):
    """A value inside an event. `plain()` gives it as upstream's JSON object."""

    def plain(self) -> dict[str, Any]:
        return {name: to_plain(getattr(self, name)) for name in self.__struct_fields__
                if getattr(self, name) is not msgspec.UNSET}


def to_plain(value: Any) -> Any:
    """Structs, lists and dicts as plain JSON values, keeping field order."""
    if isinstance(value, Payload):
        return value.plain()
    if isinstance(value, (list, tuple)):
        return [to_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: to_plain(item) for key, item in value.items()}
    return value


# ---------------------------------------------------------------- payloads


class Budget(Payload, frozen=True, kw_only=True):
    max_children: int
    qa_failure_limit: int


class PlanChild(Payload, frozen=True, kw_only=True):
    """One enrollable child as authorized: its place in the plan and its intent identity."""

    task_id: str
    slice_id: str
    blocked_by: list[str]
    intent_path: str | None = None
    intent_revision: int | None = None
    intent_content_hash: str | None = None


class IntentIdentity(Payload, frozen=True, kw_only=True):
    intent_path: str
    intent_revision: int
    intent_content_hash: str


class LaneBinding(Payload, frozen=True, kw_only=True):
    path: str
    branch: str
    base_head: str


class RestoredPath(Payload, frozen=True, kw_only=True):
    path: str
    kind: str  # "modified" | "untracked"
    lane_task_id: str


class ResumedChild(Payload, frozen=True, kw_only=True):
    task_id: str
    state: str


class LaneRefusal(Payload, frozen=True, kw_only=True):
    task_id: str
    path: str
    reason: str


class TrackerObservation(Payload, frozen=True, kw_only=True):
    task_id: str
    status: str
    message: str


class VerificationResult(Payload, frozen=True, kw_only=True):
    command: str
    exit_code: int | None
    signal: str | None
    passed: bool
    duration_ms: int


class CommandDigest(Payload, frozen=True, kw_only=True):
    """One acceptance item's command as QA or a candidate check ran it (`<task_id>:<item.id>`): whether the
    item passed, and the sha256 and length of the command's output (stdout and stderr, the one stream the
    runner reads); `output_sha256` is None when the command never started (bad descriptor, missing
    executable, failed prepare)."""

    id: str
    passed: bool
    output_sha256: str | None = None
    output_bytes: int = 0
    # Why the check failed, and when it ran (None in older logs): the runner's one-line reason (an exit
    # code, a timeout, a cancellation), the last bytes of the output (`OUTPUT_TAIL_LIMIT` at most, cut at a
    # line; output_sha256 and output_bytes still name the whole), when the command started and how long
    # it ran. Facts recorded once: a rebuild reads them from here, never from a clock.
    reason: str | None = None
    output_tail: str | None = None
    started_at: str | None = None
    duration_ms: int | None = None


# The most of a check's output the log keeps (its tail): a failed check's last lines, a passing one's summary.
OUTPUT_TAIL_LIMIT = 2048
PASSING_TAIL_LIMIT = 240


class CheckVerdict(Payload, frozen=True, kw_only=True):
    """One task's acceptance run on a candidate: failed finding ids, empty when it passed."""

    task_id: str
    passed: bool
    findings: list[str] = []
    attempts: int = 1
    flaky: list[str] = []  # finding ids that failed, then passed on a rerun (the flake policy)
    outputs: list[CommandDigest] = []  # each item's command on the candidate (the last attempt)
    # The check's inputs (None in older logs): `tree` is the identity of the tree it saw (`inputs.tree_identity`),
    # `acceptance` the digest of the acceptance it ran. `reused_from`: the version of the event whose passing
    # verdict on these very inputs stands for this one (nothing ran); `cancelled`: stopped unfinished, because
    # a candidate it stood on failed (no verdict). `covered_by`: the commit of a longer candidate of the same
    # round, carrying this one's Lanes and more on top, on which this check ran and passed; it did not run here
    # (a batched round's assumption, check by check: docs/concepts/integration.md).
    tree: str | None = None
    acceptance: str | None = None
    reused_from: int | None = None
    cancelled: bool = False
    covered_by: str | None = None


class FinalVerificationReport(Payload, frozen=True, kw_only=True):
    passed: bool
    head: str
    results: list[VerificationResult]


class InstructionOutcome(Payload, frozen=True, kw_only=True):
    task_id: str
    kind: str
    accepted: bool
    reason: str | None


class RevisionOutcome(Payload, frozen=True, kw_only=True):
    task_id: str
    accepted: bool
    reason: str | None
    fallback: str | msgspec.UnsetType = msgspec.UNSET


class ProvisionHandoff(Payload, frozen=True, kw_only=True, tag="provision", tag_field="handoff"):
    role: str = "lane-steward"
    action: str = "provision"
    task_id: str
    lane_branch: str
    base_head: str
    executor_hosts: list[str]


class ReleaseHandoff(Payload, frozen=True, kw_only=True, tag="release", tag_field="handoff"):
    role: str = "lane-steward"
    action: str = "release"
    task_id: str
    lane_branch: str


class CoordinatorHandoff(Payload, frozen=True, kw_only=True, tag="correct", tag_field="handoff"):
    role: str = "coordinator"
    action: str = "correct"
    task_id: str
    reason: str
    corrections_used: int
    corrections_left: int
    lane_path: str


class ExecutorHandoff(Payload, frozen=True, kw_only=True, tag="executor", tag_field="handoff"):
    role: str = "executor"
    task_id: str
    run_id: str | None
    record_revision: int | None
    next_obligation: str | None
    lane_branch: str
    lane_path: str


Handoff = Union[ProvisionHandoff, ReleaseHandoff, CoordinatorHandoff, ExecutorHandoff]



class ExecutorBudget(Payload, frozen=True, kw_only=True):
    """What Executor attempts may take in all (None: no bound on that measure): how many attempts, their
    wall-clock seconds added up, tokens (in and out, as the agents report them) and dollars."""

    attempts: int | None = None
    wall_seconds: int | None = None
    tokens: int | None = None
    cost_usd: float | None = None


class ExecutorBudgets(Payload, frozen=True, kw_only=True):
    """The budgets a confirmation sets (lanes_es/domain/executor_budget.py): each Lane's attempts, and the
    attempts of all the batch's Lanes together (the Initiative's)."""

    lane: ExecutorBudget = ExecutorBudget()
    initiative: ExecutorBudget = ExecutorBudget()


class ExecutorUsage(Payload, frozen=True, kw_only=True):
    """What an Executor attempt reported of itself; None where its agent reports no such thing.

    `tokens_in` counts every input token the agent processed, cached ones included; `denied_tools`
    names the tool calls the agent's own permission rules refused; `agent_error` is the agent's own
    error flag and `error` its message, cut short."""

    session_id: str | None = None
    tokens_in: int | None = None
    tokens_out: int | None = None
    cost_usd: float | None = None
    denied_tools: list[str] | None = None
    agent_error: bool | None = None
    error: str | None = None


class AttemptLimits(Payload, frozen=True, kw_only=True):
    """What one Executor attempt may take before the autopilot kills it (None: no such limit)."""

    timeout_seconds: int
    tokens: int | None = None
    cost_usd: float | None = None


class ExecutorTotal(Payload, frozen=True, kw_only=True):
    """One task's Executor attempts added up, for the report's extras in the log."""

    task_id: str
    attempts: int
    killed: int
    duration_ms: int
    tokens_in: int | None = None
    tokens_out: int | None = None
    cost_usd: float | None = None

class ReportExtras(Payload, frozen=True, kw_only=True):
    """What a written report carries beyond the record: the tick's observations."""

    handoffs: list[Handoff] = []
    lane_refusals: list[LaneRefusal] = []
    tracker_observations: list[TrackerObservation] = []
    final_verification: FinalVerificationReport | None = None
    lane_instruction: InstructionOutcome | None = None
    lane_revision: RevisionOutcome | None = None
    # lanes-es's own, never in the written report (which keeps upstream's shape): each task's Executor
    # attempts added up as of this settle; absent when no attempt was recorded (and in older logs).
    executor_totals: list[ExecutorTotal] | msgspec.UnsetType = msgspec.UNSET


# ---------------------------------------------------------------- event bases


class _EventFields(msgspec.Struct, frozen=True, kw_only=True):
    originator_id: str
    originator_version: int
    timestamp: datetime
    at: str
    digest: str = ""

    def _as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__struct_fields__}

    def apply(self, aggregate: Any) -> None:
        aggregate.apply_fact(self)

    @property
    def name(self) -> str:
        return type(self).__name__


class Event(_EventFields, CanMutateAggregate[str], frozen=True, kw_only=True):
    """An event that moves an existing aggregate."""


class CreatedEvent(_EventFields, CanInitAggregate[str], frozen=True, kw_only=True):
    """The event that starts an aggregate."""

    originator_topic: str


def canonical_bytes(event: _EventFields) -> bytes:
    """The bytes the audit chain hashes: the event's type and fields, sorted, without its digest."""
    fields = {name: getattr(event, name) for name in event.__struct_fields__ if name != "digest"}
    fields["event"] = type(event).__name__
    class_version = getattr(type(event), "class_version", 1)
    if class_version > 1:  # sealed, so a row relabelled to another schema version breaks its link
        fields["class_version"] = class_version
    return _CANONICAL.encode(fields)


def chain_digest(previous: str, event: _EventFields) -> str:
    return hashlib.sha256(previous.encode() + canonical_bytes(event)).hexdigest()


# ---------------------------------------------------------------- LaneBatch events


class BatchPrepared(CreatedEvent, frozen=True, kw_only=True):
    """A new batch: the prepared v2 record."""

    batch_id: str
    initiative_slug: str
    plan_digest: str
    base_head: str
    branch: str
    confirmation_time: str
    budget: Budget
    max_parallel: int
    children: list[PlanChild]
    final_verification: list[str] | None = None
    revision_delegation: str | None = None  # the grant's confirmation_time
    intent_identities: dict[str, IntentIdentity] | None = None
    # lanes-es's own (not in the v2 record): how lane commits integrate; None in logs from before the
    # choice existed, which integrate serially.
    integration: str | None = None
    verify_workers: int | None = None
    flake_reruns: int | None = None


class BatchStarted(Event, frozen=True, kw_only=True):
    """prepared -> running: the first write of a new batch."""


class LaneAdmitted(Event, frozen=True, kw_only=True):
    task_id: str
    lane: LaneBinding


class Enrolled(Event, frozen=True, kw_only=True):
    task_id: str
    run_id: str
    reason: str | None = None


class Settled(Event, frozen=True, kw_only=True):
    task_id: str
    qa_failures_reset: bool = False
    qa_outputs: list[CommandDigest] = []  # the Lane QA that passed (empty: after a Review, or an older log)
    qa_tree: str | None = None  # the identity of the tree that QA saw, and the acceptance it ran (for reuse)
    qa_acceptance: str | None = None


class LaneCommitted(Event, frozen=True, kw_only=True):
    task_id: str
    lane_commit: str


class Integrated(Event, frozen=True, kw_only=True):
    task_id: str
    commit: str
    adopted: bool = False
    # The serial guard's rerun on this candidate, each task's checks with their output digests (a round
    # records them on its CandidateVerified instead; empty in older logs and for an adopted commit).
    checks: list[CheckVerdict] = []


class Released(Event, frozen=True, kw_only=True):
    task_id: str


class Parked(Event, frozen=True, kw_only=True):
    """A child stops for a human; its pending dependents are skipped with it."""

    task_id: str
    reason: str
    skipped: list[str] = []
    qa_failures: int | None = None
    # An integration that failed (None and [] otherwise, and in older logs): the candidate it failed on, the
    # ref that keeps that candidate for a person to inspect, and its failed checks with their output tails.
    candidate: str | None = None
    candidate_ref: str | None = None
    failed_checks: list[CheckVerdict] = []


class Resealed(Event, frozen=True, kw_only=True):
    task_id: str
    from_digest: str
    to_digest: str
    intent_revision: int
    intent_content_hash: str


class QaFailureCounted(Event, frozen=True, kw_only=True):
    task_id: str
    qa_failures: int
    correction_due: str | None = None
    qa_outputs: list[CommandDigest] = []


class ReviewOpened(Event, frozen=True, kw_only=True):
    task_id: str
    reason: str
    qa_outputs: list[CommandDigest] = []  # the Lane QA that passed before the Review


class InterventionRecorded(Event, frozen=True, kw_only=True):
    task_id: str
    kind: str
    text: str
    text_digest: str


class DelegatedRevisionApplied(Event, frozen=True, kw_only=True):
    task_id: str
    from_revision: int
    to_revision: int
    intent_content_hash: str
    confirmation_ref: str


class DelegationGrantChanged(Event, frozen=True, kw_only=True):
    confirmation_time: str | None = None


class TrackerClosed(Event, frozen=True, kw_only=True):
    task_id: str


class HeadAdopted(Event, frozen=True, kw_only=True):
    from_head: str
    to_head: str


class LeaksRestored(Event, frozen=True, kw_only=True):
    backup: str
    paths: list[RestoredPath]


class ParkResumed(Event, frozen=True, kw_only=True):
    confirmation_time: str
    children: list[ResumedChild]


class BatchSettled(Event, frozen=True, kw_only=True):
    """The batch reached a state that writes a report: completed, needs_human, budget_stopped, failed."""

    batch_state: str
    reason: str | None
    next_action: str
    extras: ReportExtras = ReportExtras()


class BatchSuperseded(Event, frozen=True, kw_only=True):
    reason: str
    next_action: str


class OffersRefused(Event, frozen=True, kw_only=True):
    """Audit only: offers the tick refused. The record does not change."""

    refusals: list[LaneRefusal]


class TickRejected(Event, frozen=True, kw_only=True):
    """Audit only: a tick refused before changing anything (bad input, drift, store condition)."""

    reason: str


class ProjectionDriftRepaired(Event, frozen=True, kw_only=True):
    """Audit only: a projection file differed from the log and was rewritten from it."""

    path: str


class CandidateBuilt(Event, frozen=True, kw_only=True):
    """Audit only: an integration candidate, the round's batch head plus `lanes` in plan order.

    `commit` is None when the last Lane does not apply (its verdict follows at once);
    `reparented_from` names the parent an earlier, discarded candidate for the same Lane had."""

    mode: str
    lanes: list[str]
    parent: str
    commit: str | None
    reparented_from: str | None = None


class CandidateVerified(Event, frozen=True, kw_only=True):
    """Audit only: a candidate's verdict; `reason` is the park reason serial would give its last Lane.

    `bisection` marks a batched round's halving step; `unverified_intermediates` lists the Lanes
    whose own candidates this verdict covered without being verified one by one (batched)."""

    mode: str
    lanes: list[str]
    commit: str | None
    passed: bool
    reason: str | None = None
    checks: list[CheckVerdict] = []
    bisection: bool = False
    unverified_intermediates: list[str] = []


class CandidateCancelled(Event, frozen=True, kw_only=True):
    """Audit only: a candidate stacked on one that failed, stopped at once: its running checks were killed
    and recorded as cancelled (`checks`: what had finished, and what was cut short); it is rebuilt on the
    nearest passing candidate. `because` names the Lanes of the candidate that failed."""

    mode: str
    lanes: list[str]
    commit: str | None
    because: list[str]
    checks: list[CheckVerdict] = []


class CheckVerdictReused(Event, frozen=True, kw_only=True):
    """Audit only: a check that already passed in this batch on byte-identical inputs (the same task, the
    same acceptance, the same tree) was not run again on `commit` (the candidate of `lanes`); the verdict of
    event `reused_from` (`reused_event`: its type; `reused_commit`: the candidate it ran on, None for the
    Lane's QA) stands for it."""

    task_id: str
    lanes: list[str]
    commit: str | None
    tree: str
    acceptance: str
    reused_from: int
    reused_event: str
    reused_commit: str | None = None


class IntegrationModeChosen(Event, frozen=True, kw_only=True):
    """Audit only: the adaptive mode's choice for one round, and what it was chosen from: of the last
    `considered` Lanes of this Initiative and repository that reached integration (`batches`: the batches
    they belong to), `failed` did not pass. `window`: how many candidates a speculative round verifies at
    once (a batched round verifies one)."""

    mode: str
    window: int
    lanes: list[str]
    considered: int
    failed: int
    batches: list[str] = []
    reason: str = ""


class CandidateDiscarded(Event, frozen=True, kw_only=True):
    """Audit only: a verified candidate no Lane will land on (a Lane it assumed has failed)."""

    mode: str
    lanes: list[str]
    commit: str | None
    reason: str


class IntegrationFellBack(Event, frozen=True, kw_only=True):
    """Audit only: a batched round reached its cap of verifications; `lanes` integrate serially."""

    lanes: list[str]
    verifications: int
    cap: int


class ExecutorRunStarted(Event, frozen=True, kw_only=True):
    """Audit only: the autopilot starts an Executor attempt in a task's Lane (recorded before it starts).

    `adapter` is the named agent (claude-code, codex, opencode) or `command` for `--executor CMD`;
    `argv` is the command as started, the prompt replaced by `<prompt sha256:...>` and secret-looking
    values masked; `obligation` is what the attempt was asked for (first_delivery, rework, correction)."""

    task_id: str
    attempt: int
    adapter: str
    argv: list[str]
    obligation: str
    prompt_sha256: str | None = None
    limits: AttemptLimits | None = None


class ExecutorRunFinished(Event, frozen=True, kw_only=True):
    """Audit only: an Executor attempt ended by itself. Its exit status moves nothing: QA and the scope
    check decide. `exit_code` is None for a command an earlier autopilot started (its status went to that
    one); `submitted` is whether the adapter's `lanes-es task submit` succeeded, None where it did not
    try (a command submits itself; an agent that failed is not submitted)."""

    task_id: str
    attempt: int
    exit_code: int | None
    duration_ms: int
    submitted: bool | None = None
    usage: ExecutorUsage = ExecutorUsage()


class ExecutorRunKilled(Event, frozen=True, kw_only=True):
    """Audit only: an Executor attempt was ended for it: `reason` timeout, budget, interrupted, or lost
    (its process ended with the autopilot that started it, leaving no result); usage as far as reported."""

    task_id: str
    attempt: int
    reason: str
    detail: str
    duration_ms: int | None = None
    usage: ExecutorUsage = ExecutorUsage()


class ExecutorBudgetExhausted(Event, frozen=True, kw_only=True):
    """Audit only: a task's next Executor attempt would start over a budget, so none starts: the autopilot
    stops the task (as `lanes-es task stop` does), and the next tick parks it. `scope` is the budget's (lane:
    the task's own; initiative: all the batch's Lanes together), `measure` what ran out (attempts, wall,
    tokens, cost) with its `limit` and what was `spent`; `detail` says so and how to raise it."""

    task_id: str
    scope: str
    measure: str
    limit: float
    spent: float
    detail: str


class RemoteAttemptDispatched(Event, frozen=True, kw_only=True):
    """Audit only: the coordinator sent an attempt to a node of the batch's Ray cluster (the `ray` runner).

    `attempt_id` names it everywhere (the node's host keeps it under that id); `kind` is `check` (a
    candidate's), `qa` (a Lane's QA) or `executor` (an Executor attempt); `tree` is the identity of the tree
    it was given (a candidate's, or the Lane's files); `task_id` the task whose check or work it is."""

    attempt_id: str
    kind: str
    task_id: str
    node: str
    tree: str


class RemoteAttemptEnded(Event, frozen=True, kw_only=True):
    """Audit only: an attempt's result reached the coordinator (`outcome`: a check's passed, failed, cancelled or
    could not run; an Executor attempt's finished, or why it was ended: budget, timeout, stopped, ...), or a
    coordinator that started after it collected or cancelled it (`collected by a later coordinator`,
    `cancelled by a later coordinator`); only the result of an attempt the current tick or run waits for
    counts."""

    attempt_id: str
    node: str
    outcome: str


class RemoteAttemptLost(Event, frozen=True, kw_only=True):
    """Audit only: the attempt's node or its host was lost before it answered (`detail`: what Ray said).
    A lost check is sent to another node, up to a bound; it never counts as a failure of the Lane."""

    attempt_id: str
    node: str
    detail: str


AUDIT_ONLY: tuple[type[Event], ...] = (OffersRefused, TickRejected, ProjectionDriftRepaired, CandidateBuilt,
                                       CandidateVerified, CandidateDiscarded, IntegrationFellBack,
                                       ExecutorRunStarted, ExecutorRunFinished, ExecutorRunKilled,
                                       ExecutorBudgetExhausted,
                                       CandidateCancelled, CheckVerdictReused, IntegrationModeChosen,
                                       RemoteAttemptDispatched, RemoteAttemptEnded, RemoteAttemptLost)

# The card's eight transitions, by the names users search the log for.
TRANSITION_NAMES: dict[type, str] = {
    LaneAdmitted: "lane_admitted",
    Enrolled: "enrolled",
    Settled: "settled",
    LaneCommitted: "lane_committed",
    Integrated: "integrated",
    Released: "released",
    Parked: "parked",
    Resealed: "resealed",
}


# ---------------------------------------------------------------- Initiative events


class InitiativeRegistered(CreatedEvent, frozen=True, kw_only=True):
    slug: str


class BatchAuthorized(Event, frozen=True, kw_only=True):
    """A literal-user confirmation: the plan, its binding and the lane-mode facts it covers.

    v2 adds `repository`, the coordinator checkout the confirmation was given in, so that a
    store shared by several repositories can say where each batch runs (None before v2).
    v3 adds `repository_id`, the id of the repository (clone) that gave it (lanes_es/domain/initiative.py):
    it claims an Initiative keyed by slug alone for that repository (None before v3).
    v4 adds `executor_budget`, the Executor budgets the user set (None before v4: no budget).
    v5 adds `coordinator`, the worktree lanes-es made for the batch, where every coordinator step runs
    (docs/concepts/coordinator.md); None: in place, the checkout `repository` is the coordinator, as
    upstream's (every authorization before v5).
    """

    class_version = 5

    batch_id: str
    plan_digest: str
    base_head: str
    branch: str
    budget: Budget
    max_parallel: int
    children: list[PlanChild]
    confirmation_time: str
    confirmation_ref: str
    actor_id: str = "literal-user"
    final_verification: list[str] | None = None
    delegate_revisions: bool = False
    resumes: bool = False
    integration: str | None = None  # None: an authorization from before the choice, serial
    verify_workers: int | None = None
    flake_reruns: int | None = None  # a failed pre-existing check on a candidate may run again this often
    repository: str | None = None
    repository_id: str | None = None
    executor_budget: ExecutorBudgets | None = None
    # Where the batch's checks, Lane QA and Executor attempts run under this confirmation: `local`, or
    # `ray://HOST:PORT` (lanes_es/domain/runner.py); None before the choice existed: local.
    runner: str | None = None
    coordinator: str | None = None

    @staticmethod
    def upcast_v1_v2(state: dict[str, Any]) -> None:
        state["repository"] = None

    @staticmethod
    def upcast_v2_v3(state: dict[str, Any]) -> None:
        state["repository_id"] = None

    @staticmethod
    def upcast_v3_v4(state: dict[str, Any]) -> None:
        state["executor_budget"] = None

    @staticmethod
    def upcast_v4_v5(state: dict[str, Any]) -> None:
        state["coordinator"] = None


class BatchRetired(Event, frozen=True, kw_only=True):
    batch_id: str


ALL_EVENTS: tuple[type, ...] = (
    BatchPrepared, BatchStarted, LaneAdmitted, Enrolled, Settled, LaneCommitted, Integrated,
    Released, Parked, Resealed, QaFailureCounted, ReviewOpened, InterventionRecorded,
    DelegatedRevisionApplied, DelegationGrantChanged, TrackerClosed, HeadAdopted, LeaksRestored,
    ParkResumed, BatchSettled, BatchSuperseded, OffersRefused, TickRejected,
    ProjectionDriftRepaired, InitiativeRegistered, BatchAuthorized, BatchRetired,
    CandidateBuilt, CandidateVerified, CandidateDiscarded, IntegrationFellBack,
    ExecutorRunStarted, ExecutorRunFinished, ExecutorRunKilled, CandidateCancelled, CheckVerdictReused,
    IntegrationModeChosen, ExecutorBudgetExhausted,
)
