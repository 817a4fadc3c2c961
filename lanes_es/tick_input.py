"""What one tick is given: the authorization it runs under, the per-tick inputs, and the ports.

The tick never runs git or touches a file itself; everything it learns comes through
these ports, and everything it decides becomes an event saved through `persist`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from lanes_es.domain import events as ev
from lanes_es.ports import (BatchGit, CandidateBuilder, CheckRunner, IntegrationHistory, Kernel, LaneInspector, Tracker,
                            Verifier)


@dataclass(frozen=True)
class LaneOfferInput:
    task_id: str
    path: str


@dataclass(frozen=True)
class InstructionInput:
    task_id: str
    kind: str
    text: str
    session_state: str


@dataclass(frozen=True)
class RevisionInput:
    task_id: str
    next_intent: dict[str, Any]


@dataclass(frozen=True)
class TickInput:
    """One call of upstream's `start_unattended_batch` in lane mode, already parsed."""

    root: str
    initiative_slug: str
    authorization: ev.BatchAuthorized
    now: str
    max_parallel: int | None = None
    lane_offers: tuple[LaneOfferInput, ...] = ()
    lane_instruction: InstructionInput | None = None
    lane_revision: RevisionInput | None = None
    # The answer of a fresh confirmation's delegation question; None when the authorization is reused.
    revision_delegation: bool | None = None
    executor_runtime: str | None = None

    @property
    def batch_id(self) -> str:
        return self.authorization.batch_id

    @property
    def children(self) -> list[ev.PlanChild]:
        return list(self.authorization.children)

    @property
    def confirmation_time(self) -> str:
        return self.authorization.confirmation_time


class Persist(Protocol):
    def __call__(self, batch: Any) -> None:
        """Save the batch's pending events, then materialize its projections."""


class LeakRestorer(Protocol):
    def plan(self, root: str, record: dict[str, Any], entries: list[tuple[str, str]]) -> Any:
        """Each dirty path's Lane of origin (list of ProvablePath), or the first Unprovable path; reads only."""

    def restore(self, root: str, record: dict[str, Any], entries: list[tuple[str, str]],
                now: str) -> tuple[str, list[ev.RestoredPath]] | None:
        """Restore coordinator files provably written by a Lane; (backup, paths) or None."""


class PlanObserver(Protocol):
    def current_digest(self, root: str, slug: str, own_tasks: Any) -> str:
        """The plan digest the coordinator's Initiative and intents give now; PortError when underivable."""

    def unreadable_file(self, root: str, slug: str, intent_paths: Any) -> str | None:
        """The first of the Initiative and the intents at `intent_paths` this user cannot read, else None."""


class RuntimeContracts(Protocol):
    def refusal(self, root: str, executor_runtime: str | None) -> str | None:
        """`laneRuntimeContractRefusal`: None when the Lane runtime matches, else the refusal text."""


class Revisions(Protocol):
    def current_intent(self, lane_path: str, task_id: str) -> dict[str, Any] | None:
        """The Lane TaskRecord's intent_snapshot, or None."""

    def apply_delegated_revision(self, lane_path: str, task_id: str, next_intent: dict[str, Any],
                                 confirmation_ref: str, now: str) -> tuple[int, int, str]:
        """Apply a delegated breaking revision in the Lane: (from_revision, to_revision, content_hash)."""


@dataclass
class TickPorts:
    kernel: Kernel
    batch_git: BatchGit
    lanes: LaneInspector  # what the tick reads of the coordinator and its Lanes in git
    candidates: CandidateBuilder  # the candidates it builds and lands
    verifier: Verifier
    check_runner: CheckRunner | None = None  # where candidates' checks run (None: this machine's processes)
    history: IntegrationHistory | None = None  # the Initiative's earlier batches (the adaptive mode reads them)
    tracker: Tracker | None = None
    leaks: LeakRestorer | None = None
    runtime_contracts: RuntimeContracts | None = None
    revisions: Revisions | None = None
    plans: PlanObserver | None = None
    # The journal of a Ray runner (lanes_es/adapters/ray_checks.py): `drain()` gives what it sent where since
    # the last time, `settle_open(attempts)` collects or cancels an earlier coordinator's. None: local.
    remote: Any = None
    extra: dict[str, Any] = field(default_factory=dict)
