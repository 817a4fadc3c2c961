"""Fakes that implement the tick's ports, for unit tests of the tick without git or disk.

They follow upstream's test doubles (tests/SCENARIOS.md: FAKE-K `laneKernel`, FAKE-GITPORT):
a kernel that records enrollments and reports run `run-1`, a git that hands out
predictable commit ids. Integration tests use the real adapters instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lanes_es.domain import events as ev
from lanes_es.domain.authority import BatchEnrollment
from lanes_es.domain.ids import lane_branch_name
from lanes_es.domain.plan import compute_batch_plan_digest
from lanes_es.ports import (
    AdvanceResult, CommandResult, CoordinatorView, IntegrationError, IntegrationRequest, IntentRead, KernelError,
    LaneFacts, Lineage, PreflightResult, TaskProjection, Tombstone, TrackerResult,
)
from lanes_es.tick_input import TickInput, TickPorts

BASE = "b" * 40
SLUG = "initiative-slug"
NOW = "2099-01-01T00:00:00.000Z"
CONFIRMED = "2026-01-01T00:00:00.000Z"


@dataclass
class FakeKernel:
    enrolled: dict[str, str] = field(default_factory=dict)
    frozen: set[str] = field(default_factory=set)
    settled: set[str] = field(default_factory=set)
    reworking: set[str] = field(default_factory=set)
    advanced: list[str] = field(default_factory=list)
    overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    advance_results: dict[str, AdvanceResult] = field(default_factory=dict)
    advance_error: str | None = None
    claims: dict[str, str] = field(default_factory=dict)  # lane path -> claim task (for admission)
    tombstones: dict[str, Tombstone] = field(default_factory=dict)

    def project_task(self, lane_path: str, task_id: str) -> TaskProjection:
        holds = task_id in self.enrolled and task_id not in self.settled
        fields: dict[str, Any] = dict(
            error=None, claim_task_id=task_id if holds else None, run_id="run-1", record_revision=1,
            lifecycle="done" if task_id in self.settled else "active",
            artifact_state="frozen" if task_id in self.frozen else "active", next_obligation="submit_assurance",
            completion_ready=task_id in self.settled)
        fields.update(self.overrides.get(task_id, {}))
        return TaskProjection(**fields)

    def active_claim_task_id(self, lane_path: str) -> str | None:
        if lane_path in self.claims:
            return self.claims[lane_path]
        for task_id, path in self.enrolled.items():
            if path == lane_path and task_id not in self.settled:
                return task_id
        return None

    def enroll_task(self, lane_path: str, task_id: str, enrollment: BatchEnrollment) -> None:
        try:
            enrollment.capability.consume_child(task_id)
        except ValueError as error:
            raise KernelError(str(error)) from None
        self.enrolled[task_id] = lane_path

    def advance_task(self, lane_path: str, task_id: str) -> AdvanceResult:
        if self.advance_error:
            raise KernelError(self.advance_error)
        self.advanced.append(task_id)
        if task_id in self.advance_results:
            return self.advance_results[task_id]
        if task_id in self.reworking:
            self.frozen.discard(task_id)
            return AdvanceResult(state="rework", operation="qa")
        self.settled.add(task_id)
        return AdvanceResult(state="completed")

    def read_tombstone(self, root: str, task_id: str) -> Tombstone | None:
        return self.tombstones.get(task_id)

    def settled_evidence(self, lane_path: str, task_id: str) -> Any:
        return {"task_id": task_id}


@dataclass
class FakeBatchGit:
    scopes: dict[str, list[str]] = field(default_factory=dict)
    commit_errors: dict[str, str] = field(default_factory=dict)
    existing: dict[str, str] = field(default_factory=dict)
    commits: list[str] = field(default_factory=list)
    preflight_result: PreflightResult = field(default_factory=lambda: PreflightResult(ok=True, branch=f"imm/{SLUG}"))

    def preflight(self, root: str, initiative_slug: str, base_head: str, *, reuse_head: str | None = None,
                  create: bool = True) -> PreflightResult:
        return self.preflight_result

    def commit_child(self, lane_path: str, task_id: str, batch_id: str, expected_head: str, branch: str,
                     evidence: Any) -> str:
        if task_id in self.commit_errors:
            from lanes_es.ports import PortError
            raise PortError(self.commit_errors[task_id])
        self.commits.append(task_id)
        return f"lane-{task_id}".ljust(40, "0")

    def lookup_batch_commit(self, lane_path: str, task_id: str, batch_id: str, expected_head: str, branch: str,
                            evidence: Any) -> str | None:
        return self.existing.get(task_id)

    def read_intent(self, root: str, task_id: str, intent_path: str | None) -> IntentRead:
        scope = self.scopes.get(task_id, ["a.txt", "b.txt"])
        return IntentRead(intent={"task_id": task_id, "scope_hint": scope, "revision": 1},
                          content_hash="sha256:" + "0" * 64, path=intent_path or f"docs/plans/{task_id}.intent.json")


@dataclass
class FakeLaneGit:
    """Lanes are dict entries; the batch branch is a list of commits over BASE."""

    facts: dict[str, LaneFacts] = field(default_factory=dict)
    head: str = BASE
    branch: str = f"imm/{SLUG}"
    integrate_errors: dict[str, IntegrationError] = field(default_factory=dict)
    integrated: dict[str, str] = field(default_factory=dict)  # task -> commit found on the branch
    audit: set[str] = field(default_factory=set)
    lineage_override: Lineage | None = None
    inspected: list[str] = field(default_factory=list)
    kept: dict[str, str] = field(default_factory=dict)  # ref -> the failed candidate it keeps

    def add_lane(self, task_id: str, path: str | None = None, **overrides: Any) -> str:
        path = path or f"/lanes/{task_id}"
        values = dict(exists=True, real_path=path, same_repository=True, is_worktree_root=True,
                      branch=lane_branch_name(SLUG, task_id), head=self.head, clean=True)
        values.update(overrides)
        self.facts[path] = LaneFacts(**values)
        return path

    def coordinator_view(self, root: str) -> CoordinatorView:
        return CoordinatorView(branch=self.branch, head=self.head, entries=[])

    def inspect_lane(self, coordinator_root: str, lane_path: str) -> LaneFacts:
        self.inspected.append(lane_path)
        return self.facts.get(lane_path, LaneFacts(exists=False, real_path=None))

    def resolve_root(self, root: str) -> str:
        return root

    def classify_lineage(self, root: str, branch: str, expected_head: str, commits: list[str], batch_id: str,
                         view: Any = None) -> Lineage:
        if self.lineage_override is not None:
            return self.lineage_override
        if self.head == expected_head:
            return Lineage(kind="equal", head=self.head)
        return Lineage(kind="fast_forward", head=self.head)

    def integrate(self, request: IntegrationRequest, checks: list[Any] | None = None, verify: Any = None) -> str:
        task_id = request.child.task_id
        if task_id in self.integrate_errors:
            raise self.integrate_errors[task_id]
        commit = f"int-{task_id}".ljust(40, "0")
        self.head = commit
        return commit

    def find_integrated(self, root: str, task_id: str, batch_id: str, from_head: str, lane_base: str,
                        lane_commit: str) -> str | None:
        return self.integrated.get(task_id)

    def keep_candidate(self, root: str, ref: str, commit: str) -> str | None:
        self.kept[ref] = commit
        return ref

    def audit_reachable(self, root: str, head: str, task_id: str) -> bool:
        return task_id in self.audit


@dataclass
class FakeVerifier:
    failing: set[str] = field(default_factory=set)

    def run_final_verification(self, root: str, commands: list[str]) -> tuple[str, list[CommandResult]]:
        return "head", [CommandResult(command=c, exit_code=1 if c in self.failing else 0, signal=None,
                                      passed=c not in self.failing, duration_ms=1) for c in commands]


@dataclass
class FakeTracker:
    calls: list[tuple[str, str]] = field(default_factory=list)
    fail_first: bool = False

    def mark_terminal(self, root: str, task_id: str, phase: str, terminal_event_id: str) -> TrackerResult:
        self.calls.append((task_id, terminal_event_id))
        if self.fail_first and len(self.calls) == 1:
            return TrackerResult(status="retryable_failure", message="gh unavailable")
        return TrackerResult(status="updated", message="terminal Task Issue closure confirmed")


def plan_children(*specs: tuple[str, list[str]]) -> list[ev.PlanChild]:
    return [ev.PlanChild(task_id=task_id, slice_id=f"S{index + 1}", blocked_by=blocked,
                         intent_path=f"docs/plans/{task_id}.intent.json", intent_revision=1,
                         intent_content_hash="0" * 64)
            for index, (task_id, blocked) in enumerate(specs)]


def authorization(children: list[ev.PlanChild], *, max_parallel: int = 1, max_children: int | None = None,
                  qa_failure_limit: int = 3, confirmation_time: str = CONFIRMED, batch_id: str = "batch-001",
                  final_verification: list[str] | None = None, delegate: bool = False) -> ev.BatchAuthorized:
    from datetime import datetime, timezone

    return ev.BatchAuthorized(
        originator_id=f"initiative:{SLUG}", originator_version=2, timestamp=datetime.now(timezone.utc),
        at=confirmation_time, batch_id=batch_id, plan_digest=compute_batch_plan_digest(children), base_head=BASE,
        branch=f"imm/{SLUG}", budget=ev.Budget(max_children=max_children or len(children),
                                                qa_failure_limit=qa_failure_limit),
        max_parallel=max_parallel, children=children, confirmation_time=confirmation_time,
        confirmation_ref="confirm", final_verification=final_verification, delegate_revisions=delegate)


@dataclass
class Harness:
    """A tick runner over fakes and the in-memory store, like upstream's `startBatch` fixture."""

    children: list[ev.PlanChild]
    max_parallel: int = 1
    qa_failure_limit: int = 3
    max_children: int | None = None
    final_verification: list[str] | None = None
    kernel: FakeKernel = field(default_factory=FakeKernel)
    batch_git: FakeBatchGit = field(default_factory=FakeBatchGit)
    lane_git: FakeLaneGit = field(default_factory=FakeLaneGit)
    verifier: FakeVerifier = field(default_factory=FakeVerifier)
    tracker: FakeTracker | None = None
    batch: Any = None
    saves: int = 0
    confirmation_time: str = CONFIRMED

    def authorization(self) -> ev.BatchAuthorized:
        return authorization(self.children, max_parallel=self.max_parallel, max_children=self.max_children,
                             qa_failure_limit=self.qa_failure_limit, confirmation_time=self.confirmation_time,
                             final_verification=self.final_verification)

    def ports(self) -> TickPorts:
        return TickPorts(kernel=self.kernel, batch_git=self.batch_git, lanes=self.lane_git, candidates=self.lane_git,
                         verifier=self.verifier, tracker=self.tracker)

    def tick(self, offers: list[tuple[str, str]] = (), max_parallel: int | None = None, **inputs: Any) -> dict[str, Any]:
        from lanes_es.tick import run_lane_batch
        from lanes_es.tick_input import LaneOfferInput

        tick = TickInput(root="/coordinator", initiative_slug=SLUG, authorization=self.authorization(), now=NOW,
                         max_parallel=max_parallel if max_parallel is not None else (None if self.batch else self.max_parallel),
                         lane_offers=tuple(LaneOfferInput(task_id=t, path=p) for t, p in offers), **inputs)

        def persist(batch: Any) -> None:
            self.saves += 1
            batch.collect_events()

        outcome = run_lane_batch(tick, self.batch, self.ports(), persist)
        if outcome.batch is not None:
            outcome.batch.collect_events()  # unsaved events of a refused tick are dropped, as a crash would
        self.batch = outcome.batch
        return outcome.report

    def states(self) -> list[str]:
        return [child["state"] for child in self.batch.record["children"]]
