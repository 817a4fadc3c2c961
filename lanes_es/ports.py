"""The ports the tick drives. Adapters implement them with git, files and processes;
unit tests implement them with fakes. Values crossing a port are small frozen Structs.

Errors: an adapter raises `PortError` subclasses whose message is what upstream would
show (a park reason, a refusal detail); the tick records the message as it is.
"""

from __future__ import annotations

from typing import Any, Protocol

import msgspec

from lanes_es.domain.events import CommandDigest, VerificationResult

# ---------------------------------------------------------------- values


class LaneFacts(msgspec.Struct, frozen=True, kw_only=True):
    """What one read of an offered or bound Lane path shows (upstream's LaneFacts)."""

    exists: bool
    real_path: str | None
    same_repository: bool = False
    is_worktree_root: bool = False
    branch: str | None = None
    head: str | None = None
    clean: bool = False
    active_claim_task_id: str | None = None


class Lineage(msgspec.Struct, frozen=True, kw_only=True):
    """`classifyBatchLineage`: equal, fast_forward (to `head`) or broken (with `message`)."""

    kind: str
    head: str
    message: str = ""


class CoordinatorView(msgspec.Struct, frozen=True, kw_only=True):
    """One read of the coordinator checkout: branch, HEAD and porcelain entries together."""

    branch: str | None
    head: str | None
    entries: list[tuple[str, str]]  # (two-letter porcelain v1 code, path)


class PreflightResult(msgspec.Struct, frozen=True, kw_only=True):
    ok: bool
    reason: str = ""
    message: str = ""
    branch: str = ""


class IntentRead(msgspec.Struct, frozen=True, kw_only=True):
    """A TaskIntent read at a root: the normalized intent and its canonical content hash."""

    intent: dict[str, Any]
    content_hash: str
    path: str


class TaskProjection(msgspec.Struct, frozen=True, kw_only=True):
    """`projectTask` of a Lane: its error, claim and the projection fields the tick reads."""

    error: str | None = None
    claim_task_id: str | None = None
    run_id: str | None = None
    record_revision: int | None = None
    lifecycle: str | None = None  # active | done | stopped
    artifact_state: str | None = None  # active | frozen
    next_obligation: str | None = None
    completion_ready: bool = False
    open_user_decision_count: int = 0
    replan_required_ids: list[str] = []


class AdvanceResult(msgspec.Struct, frozen=True, kw_only=True):
    """`BatchChildAdvanceResult`: completed, review_ready, rework, stopped, ... ."""

    state: str
    operation: str | None = None
    operation_id: str | None = None
    reason: str = ""
    environment_failure: bool = False
    recovery_category: str | None = None
    qa_outputs: list[CommandDigest] = []  # the QA run of this advance, item by item (none ran: empty)
    qa_tree: str | None = None  # the identity of the tree that QA saw, and the acceptance it ran (None: no QA ran)
    qa_acceptance: str | None = None


class Tombstone(msgspec.Struct, frozen=True, kw_only=True):
    task_id: str
    lifecycle_status: str
    terminal_lifecycle: str
    terminal_event_id: str


class IntegrationChild(msgspec.Struct, frozen=True, kw_only=True):
    task_id: str
    intent_path: str | None
    commit: str | None = None


class IntegrationRequest(msgspec.Struct, frozen=True, kw_only=True):
    root: str
    branch: str
    batch_head: str
    lane_base: str
    lane_commit: str
    child: IntegrationChild
    siblings: list[IntegrationChild]


class CandidateBuild(msgspec.Struct, frozen=True, kw_only=True):
    """An integration candidate made but not landed: its commit and the commits in lane_base..parent."""

    commit: str
    landed_since_base: list[str]


class CandidateCheck(msgspec.Struct, frozen=True, kw_only=True):
    task_id: str
    findings: list[str]  # failed finding ids, empty when the task's acceptance passed
    attempts: int = 1
    flaky: list[str] = []  # finding ids that failed, then passed on a rerun
    outputs: list[CommandDigest] = []  # each item's command output digest (the last attempt)
    tree: str | None = None  # the check's inputs: the identity of the tree it saw, the acceptance it ran
    acceptance: str | None = None
    reused_from: int | None = None  # the log event whose passing verdict on the same inputs stands for it
    cancelled: bool = False  # cut short: a candidate it stood on failed
    covered_by: str | None = None  # not run: it passed on this longer candidate of the round (domain `covering`)


class CheckRun(msgspec.Struct, frozen=True, kw_only=True):
    """One task's acceptance run on one tree (CheckRunner): its failed finding ids (empty: it passed), each
    item's command facts, and whether a cancellation cut it short (its verdict then means nothing)."""

    task_id: str
    findings: list[str]
    outputs: list[CommandDigest] = []
    cancelled: bool = False


def check_on(tree: str, check: "PlannedCheck", run: CheckRun, attempts: int = 1,
             flaky: list[str] | None = None) -> CandidateCheck:
    """A task's run on a candidate (`tree`: the identity of the tree it saw) as its verdict carries it."""
    return CandidateCheck(task_id=check.task_id, findings=list(run.findings), attempts=attempts, flaky=flaky or [],
                          outputs=list(run.outputs), tree=tree, acceptance=check.acceptance, cancelled=run.cancelled)


class PlannedCheck(msgspec.Struct, frozen=True, kw_only=True):
    """A task whose acceptance runs on a candidate: its intent as the candidate holds it, the digest of that
    acceptance, and (under a flake policy) its intent at the Lane's base, None when it had none there."""

    task_id: str
    intent: dict[str, Any]
    acceptance: str
    at_base: dict[str, Any] | None = None


class CandidateChecks(msgspec.Struct, frozen=True, kw_only=True):
    """What verifying a candidate runs: its commit, the tree every check sees (an adapter's value the
    CheckRunner takes, `tree_identity` naming what it holds), and the tasks to run on it, child first."""

    commit: str
    tree: Any
    tree_identity: str
    checks: list[PlannedCheck]


class CandidateVerdict(msgspec.Struct, frozen=True, kw_only=True):
    """The acceptance rerun on a candidate: each task's result, and serial's park reason when one failed."""

    commit: str
    checks: list[CandidateCheck]
    reason: str | None = None

    @property
    def passed(self) -> bool:
        return self.reason is None

    @classmethod
    def of(cls, commit: str, checks: list[CandidateCheck]) -> "CandidateVerdict":
        """The candidate's verdict from its checks: serial's park reason when any failed."""
        from lanes_es.domain.candidates import check_failure_reason

        failed = [finding for check in checks for finding in check.findings]
        return cls(commit=commit, checks=checks, reason=check_failure_reason(failed, commit) if failed else None)


class TrackerResult(msgspec.Struct, frozen=True, kw_only=True):
    status: str
    message: str


# One final-verification command's outcome is the same fact in the port and in the log.
CommandResult = VerificationResult


class Cancel:
    """Set once, from any thread: whatever works under it stops. Who starts work under it says how to stop
    that work (`on_set`: an adapter kills the process group it started); a hook added after `set` runs at once."""

    def __init__(self) -> None:
        import threading

        self._set = threading.Event()
        self._lock = threading.Lock()
        self._hooks: dict[int, Any] = {}
        self._next = 0

    def is_set(self) -> bool:
        return self._set.is_set()

    def set(self) -> None:
        with self._lock:
            self._set.set()
            hooks = list(self._hooks.values())
        for hook in hooks:
            hook()

    def on_set(self, hook: Any) -> int:
        """Run `hook` when this is set (now, when it already is); the number `forget` takes."""
        with self._lock:
            self._next += 1
            self._hooks[self._next] = hook
            already = self._set.is_set()
        if already:
            hook()
        return self._next

    def forget(self, number: int | None) -> None:
        with self._lock:
            self._hooks.pop(number or 0, None)


# ---------------------------------------------------------------- errors


class PortError(Exception):
    """An adapter's refusal or failure; its message is shown and recorded as it is."""


class GitFailure(PortError):
    """A git command failed in a way the caller did not expect."""


class IntegrationError(PortError):
    """A guarded integration refused; `reason` is the BatchIntegrationReason code. A refusal by the checks
    names the candidate they failed on and carries their results (`checks`)."""

    def __init__(self, reason: str, message: str, candidate: str | None = None,
                 checks: list[CandidateCheck] | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.candidate = candidate
        self.checks = checks or []


class KernelError(PortError):
    """The kernel refused or failed (enrollment, advance, projection)."""


# ---------------------------------------------------------------- ports


class Clock(Protocol):
    def now(self) -> str:
        """The tick's `now` as a canonical timestamp."""


class BatchGit(Protocol):
    """Git at the coordinator and in a Lane for the serial-port operations."""

    def preflight(self, root: str, initiative_slug: str, base_head: str, *,
                  reuse_head: str | None = None, create: bool = True) -> PreflightResult:
        """docs/upstream.md#the-batch-branch-preflight. `reuse_head` is the expected head of the newest settled batch that may reuse the branch."""

    def commit_child(self, lane_path: str, task_id: str, batch_id: str, expected_head: str,
                     branch: str, evidence: Any) -> str:
        """docs/upstream.md#the-lane-commit: the lane commit; raises PortError with upstream's message."""

    def lookup_batch_commit(self, lane_path: str, task_id: str, batch_id: str, expected_head: str,
                            branch: str, evidence: Any) -> str | None:
        """docs/upstream.md#finding-a-lane-commit-again: an existing lane commit for this child and batch, verified, or None."""

    def read_intent(self, root: str, task_id: str, intent_path: str | None) -> IntentRead:
        """docs/upstream.md#taskintent-v1 readTaskIntent: tracked, regular, no symlink, <= 64 KiB, parsed. Raises PortError."""


class LaneInspector(Protocol):
    """What the tick reads in git of the coordinator and its Lanes (adapters/lane_git.py)."""

    def coordinator_view(self, root: str) -> CoordinatorView:
        """Branch, HEAD and porcelain entries of the coordinator in one read."""

    def inspect_lane(self, coordinator_root: str, lane_path: str) -> LaneFacts:
        """docs/upstream.md#lane-inspection-and-admission, without the claim (the tick asks the kernel): at most 2 git spawns."""

    def resolve_root(self, root: str) -> str:
        """realpath(root), or root unchanged."""

    def classify_lineage(self, root: str, branch: str, expected_head: str, commits: list[str],
                         batch_id: str, view: CoordinatorView | None = None) -> Lineage:
        """docs/upstream.md#the-batch-lineage; `view` saves the branch and HEAD read when the caller has one."""

    def find_integrated(self, root: str, task_id: str, batch_id: str, from_head: str, lane_base: str,
                        lane_commit: str) -> str | None:
        """docs/upstream.md#the-guarded-integration findIntegratedCandidate."""

    def audit_reachable(self, root: str, head: str, task_id: str) -> bool:
        """docs/upstream.md#lane-inspection-and-admission: a complete audit pair for the task in `head`'s tree."""


class CandidateBuilder(Protocol):
    """What the tick asks of git to integrate settled Lanes: candidates built, their checks planned (the verifier
    runs them), the batch branch fast-forwarded (adapters/candidate_git.py)."""

    def build_candidate(self, request: IntegrationRequest) -> CandidateBuild:
        """The candidate `request.batch_head` + the lane commit, the branch untouched; IntegrationError as integrate."""

    def build_chain(self, root: str, parent: str, lanes: list[tuple[str, str]]
                    ) -> list[CandidateBuild | IntegrationError]:
        """The candidates parent + L1, + L2, ... of (lane base, lane commit) pairs, each as `build_candidate`
        would build it on the one before; the list stops at the first failure, which it holds."""

    def candidate_checks(self, request: IntegrationRequest, build: CandidateBuild,
                         flake_reruns: int = 0) -> CandidateChecks:
        """What the acceptance rerun of docs/upstream.md#the-descriptor-rerun-and-deterministic-qa runs on a built candidate (the child, then each sibling landed
        since the lane base, their intents as the candidate holds them); IntegrationError when the rerun
        cannot run at all (an intent absent or unreadable, a descriptor invalid). With `flake_reruns`, each
        task's intent at the lane base too."""

    def land_candidate(self, root: str, branch: str, expected_head: str, commit: str) -> str:
        """The branch's lineage checked as integrate checks it, then a fast-forward to `commit`."""

    def keep_candidate(self, root: str, ref: str, commit: str) -> str | None:
        """Point `ref` at a candidate that failed, so that a person can inspect it (git would otherwise
        collect it); the ref, or None when git refused (the park goes on without it)."""

    def integrate(self, request: IntegrationRequest, checks: list[CandidateCheck] | None = None,
                  verify: Any = None) -> str:
        """docs/upstream.md#the-guarded-integration: the new batch head; raises IntegrationError (branch unmoved). `checks`, when given,
        receives each task's rerun on the candidate (findings and output digests) for the log. `verify`, when
        given, runs the rerun (CandidateChecks -> CandidateVerdict: the tick's, with its workers and reuse);
        without it the checks run one after another here."""


class Kernel(Protocol):
    def project_task(self, lane_path: str, task_id: str) -> TaskProjection:
        """Never raises: a failure is `TaskProjection(error=...)`."""

    def active_claim_task_id(self, lane_path: str) -> str | None:
        """The Lane's active claim task, None, or "unreadable"."""

    def enroll_task(self, lane_path: str, task_id: str, enrollment: Any) -> None:
        """Enroll under the batch capability (a `BatchEnrollment`); raises KernelError."""

    def advance_task(self, lane_path: str, task_id: str) -> AdvanceResult:
        """Drive a frozen child's QA and review; raises KernelError on a store condition."""

    def read_tombstone(self, root: str, task_id: str) -> Tombstone | None:
        """The task's terminal proof as tracked at `root` (the batch branch after integration)."""

    def settled_evidence(self, lane_path: str, task_id: str) -> Any:
        """What the lane commit needs of a settled run (a batch_git.SettledEvidence); raises KernelError."""


class Tracker(Protocol):
    def mark_terminal(self, root: str, task_id: str, phase: str, terminal_event_id: str) -> TrackerResult:
        """Close the child's Issue; statuses as upstream's tracker (updated, already_current, ...)."""


class CheckRunner(Protocol):
    """Where a candidate's checks run (this machine's processes; a cluster's workers): a tree and a task's
    intent go out, the check's result comes back. Only the coordinator touches git and the log."""

    def run_check(self, tree: Any, task_id: str, intent: dict[str, Any], cancel: Any = None) -> CheckRun:
        """The task's acceptance on a fresh copy of `tree` (CandidateChecks.tree); blocks until it ends. When
        `cancel` (a `Cancel`) is set, its running command is killed and the run is `cancelled`.
        Raises IntegrationError when the run cannot complete at all."""


class IntegrationHistory(Protocol):
    """How the Initiative's earlier batches integrated: what the adaptive mode chooses from."""

    def earlier_outcomes(self, initiative_slug: str, batch_id: str) -> tuple[list[bool], list[str]]:
        """Newest first: for each Lane of the Initiative's batches before `batch_id` that reached integration,
        whether it integrated (True) or failed there (False); and the ids of the batches read."""


class Verifier(Protocol):
    def run_final_verification(self, root: str, commands: list[str]) -> tuple[str, list[CommandResult]]:
        """docs/upstream.md#final-verification: (head, results), each command split on spaces and run without a shell."""


class Coordinators(Protocol):
    """The coordinator worktrees lanes-es makes for batches, and the landing of a batch branch
    (lanes_es/adapters/coordinator_git.py). Refusals are `ServiceError`s with the next command."""

    def prepare(self, repo_root: str, path: str, branch: str, head: str, slug: str) -> None:
        """Make or reuse the worktree at `path` for a new batch on `head`."""

    def restore(self, repo_root: str, path: str, branch: str, base_head: str) -> bool:
        """Make a running batch's removed coordinator again; False when git cannot."""

    def remove_if_clean(self, repo_root: str, path: str) -> str | None:
        """Remove it unless it holds uncommitted work; why it was kept, else None."""

    def current_branch(self, checkout: str) -> str | None:
        """The branch checked out in `checkout` (None: detached)."""

    def land(self, repo_root: str, branch: str, head: str, onto: str, slug: str) -> Any:
        """Fast-forward `onto` to `branch` at `head`, or refuse."""
