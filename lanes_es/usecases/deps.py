"""`Deps`: the ports every use case is given; the composition root (lanes_es/bootstrap.py) wires the real ones."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

from lanes_es.adapters.store import EventStore, default_store_url
from lanes_es.domain.repository import RepositoryIdentity
from lanes_es.ports import Coordinators
from lanes_es.tick_input import TickPorts


class Adapters(Protocol):
    def tick_ports(self, root: str, slug: str) -> TickPorts:
        """Fresh ports for one tick (caches inside them live for one tick only)."""

    def on_cluster(self, ports: TickPorts, runner: str, batch_id: str) -> TickPorts:
        """`ports` with the batch's checks on the Ray cluster `runner` (only asked for when the batch's
        authorization names one)."""

    def coordinators(self) -> Coordinators:
        """The coordinator worktrees and the landing of a batch branch (lanes_es/usecases/coordinator.py)."""

    def head(self, root: str) -> str:
        """The coordinator's HEAD commit."""

    def ensure_state_ignored(self, root: str) -> bool:
        """Add `.imm/state/` to `.git/info/exclude` when git does not ignore it; True when added."""

    def read_initiative(self, root: str, slug: str) -> dict[str, Any]:
        """The Initiative's observation (the Local carrier)."""

    def anchor_log(self, root: str, batch_id: str, version: int, read_rows: Callable[[int], Any]) -> Any:
        """Bring the batch's signed checkpoint in git up to `version` (lanes_es/audit/anchor.py)."""

    def repository_identity(self, root: str) -> RepositoryIdentity:
        """The repository id and checkout `root` is in now; a Refusal or OSError when it cannot be read."""


@dataclass
class Deps:
    """What a use case is given: the coordinator checkout, the log, the adapters and the clock.

    `root` is the coordinator: the checkout the command runs in, or the coordinator worktree of the
    batch (lanes_es/usecases/coordinator.py), when `checkout` is the user's checkout the command runs in.
    `stats_path` is LANES_ES_STATS: the file a tick appends its counts to (None: none).
    """

    root: str
    store: EventStore
    adapters: Adapters
    now: Callable[[], str]
    stats_path: str | None = None
    checkout: str | None = None

    @property
    def user_checkout(self) -> str:
        """The checkout the command runs in (the user's), whatever checkout coordinates the batch."""
        return self.checkout or self.root

    def repository_opened(self) -> RepositoryIdentity:
        """The checkout this command runs in and the repository id the store was opened with."""
        return RepositoryIdentity(repository_id=getattr(self.store, "repository_id", None),
                                  checkout=self.user_checkout)

    def repository_now(self) -> RepositoryIdentity:
        """The same, read from the files now when the adapters can (the gate compares them after the user's
        answer), else as the store was opened."""
        read = getattr(self.adapters, "repository_identity", None)
        return self.repository_opened() if read is None else read(self.user_checkout)

    def store_is_shared(self) -> bool:
        """Whether the log is not this checkout's own embedded store (only a shared one can be read from
        another checkout)."""
        common_dir = getattr(self.adapters, "common_dir", None)
        return not (common_dir is not None and getattr(self.store, "url", None) == default_store_url(common_dir))
