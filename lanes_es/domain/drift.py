"""Has the world moved under a running batch since its confirmation? (pure: decided from facts)

A batch runs only on what its literal user confirmed: the plan (children, their order and
dependencies, and each intent's identity, bound by the plan digest) and the batch branch.
upstream re-derives them on every resume and reuses the authorization only while none moved
(docs/upstream.md#authorization-reuse-and-the-tool-surface, reuse blockers
`batch_plan_digest_changed`, `batch_branch_changed`); anything else needs a fresh confirmation. Every tick of lanes-es asks
the same question before it moves any child, from facts its adapters read
(lanes_es/adapters/plan_observer.py and the coordinator status), and stops the batch with the
first blocker that holds.

The head is not decided here. A fast-forward of the batch branch (a user's commit on it) blocks
nothing: the lineage check adopts it in the same tick (`adopted_heads`), as upstream does. A head
that moved without descending from the expected one is upstream's last reuse blocker,
`batch_head_lineage_moved`; its fresh confirmation ends in the runtime's lineage check, which
fails the batch (`batch_head_lineage_broken`), and that check fails it here directly.

The repository is lanes-es's own blocker (upstream runs in the one checkout it was called in):
a store shared by several checkouts can be ticked from one the confirmation was not given in.
The repository is the coordinator checkout's top level by real path, as the authorization
recorded it (`BatchAuthorized.repository`): a checkout renamed or copied whole (which keeps the
repository id the store keys Initiatives by, so it finds the batch) is another checkout until a
fresh confirmation is given there. A log in the checkout's own
embedded store is not judged: wherever that checkout went (renamed, copied whole), its log went
with it and no other checkout reads it. Nor is an authorization from before the field (None).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lanes_es.domain.repository import RepositoryIdentity

PLAN_DIGEST_CHANGED = "batch_plan_digest_changed"
BRANCH_CHANGED = "batch_branch_changed"
REPOSITORY_CHANGED = "batch_repository_changed"  # lanes-es's own; upstream has no such blocker


@dataclass(frozen=True)
class Covered:
    """What the confirmation covers, as the batch's log has it now (a reseal included)."""

    plan_digest: str
    branch: str

    @classmethod
    def of(cls, record: dict[str, Any]) -> "Covered":
        return cls(plan_digest=record["plan_digest"], branch=record["branch"])


@dataclass(frozen=True)
class Observed:
    """The same facts read now. `plan_digest` None: the plan cannot be derived (`plan_error` says why)."""

    plan_digest: str | None
    branch: str | None
    plan_error: str | None = None


@dataclass(frozen=True)
class Drift:
    code: str
    detail: str

    @property
    def reason(self) -> str:
        return f"{self.code}: {self.detail}"


def decide_drift(covered: Covered, observed: Observed) -> Drift | None:
    """The first reuse blocker that holds, or None when the batch may go on under its confirmation."""
    if observed.plan_digest is None:
        return Drift(PLAN_DIGEST_CHANGED, f"the plan can no longer be derived from the Initiative and its intents "
                                          f"({observed.plan_error or 'unreadable'})")
    if observed.plan_digest != covered.plan_digest:
        return Drift(PLAN_DIGEST_CHANGED, f"the Initiative and its intents now digest to {observed.plan_digest}, "
                                          f"the confirmation covers {covered.plan_digest}")
    if observed.branch != covered.branch:
        return Drift(BRANCH_CHANGED, f"the coordinator is on {observed.branch or '(detached HEAD)'}, "
                                     f"the confirmation covers {covered.branch}")
    return None


def decide_repository(recorded: RepositoryIdentity | None, here: RepositoryIdentity,
                      shared_store: bool) -> Drift | None:
    """`here` is where the command runs (the checkout's resolved top level and its repository id), on a
    store `shared_store` or the checkout's own; None when that is where the confirmation was given (or
    the log lives in the checkout itself). Another checkout differs; so does another clone at the
    same path (its repository id is not the recorded one), when both ids are known."""
    if not shared_store or recorded is None or _same_repository(recorded, here):
        return None
    if recorded.checkout != here.checkout:
        return Drift(REPOSITORY_CHANGED, f"this checkout {here.checkout} is not the repository the batch was "
                                         f"confirmed in ({recorded.checkout})")
    return Drift(REPOSITORY_CHANGED, f"this checkout {here.describe()} is another clone than the one the batch was "
                                     f"confirmed in ({recorded.describe()})")


def coordinated_here(authorization: Any, here: RepositoryIdentity, shared_store: bool) -> bool:
    """Whether the batch `authorization` (its newest) confirmed is coordinated from `here`: the one question
    that decides which batches are this checkout's (`rebuild --all` judges and writes only those; a tick and
    retire refuse the others through `decide_repository`). On the checkout's own store every batch is."""
    return decide_repository(RepositoryIdentity.of_authorization(authorization), here, shared_store) is None


def _same_repository(recorded: RepositoryIdentity, here: RepositoryIdentity) -> bool:
    if recorded.checkout != here.checkout:
        return False
    return recorded.repository_id is None or here.repository_id is None or recorded.repository_id == here.repository_id


def repository_next_action(slug: str, recorded: str) -> str:
    return (f"nothing was changed here or there; run lanes-es in {recorded}, or, if this checkout is where the "
            f"batch should go on (the repository was moved), confirm it here with `lanes-es authorize {slug}`")


def drift_next_action(slug: str) -> str:
    return (f"Something the confirmation covered moved after it; nothing more is admitted, committed or "
            f"integrated. Check the change, then confirm the batch as it now stands with `lanes-es authorize "
            f"{slug}` (or put the change back, or retire the batch with `lanes-es retire {slug}`).")
