"""The composition root: the one place that chooses real adapters and wires the use cases' ports.

`bootstrap` gives the `Deps` every use case (lanes_es/usecases/) takes; everything else takes
its ports as arguments, and tests wire fakes or real adapters the same way this module does.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lanes_es.adapters.git_dirs import common_dir_of, find_checkout
from lanes_es.adapters.store import EventStore, default_store_url, store_url_from_env
from lanes_es.domain.ids import format_timestamp
from lanes_es.errors import ServiceError
from lanes_es.ports import GitFailure
from lanes_es.usecases.deps import Deps

if TYPE_CHECKING:
    from lanes_es.domain.repository import RepositoryIdentity
    from lanes_es.tick_input import TickPorts

# The adapters are imported where they are first used, so that a command that only reads the
# store (`status`, `verify`) does not pay for git, the kernel and QA (`lanes-es bench startup`).


def system_now() -> str:
    return format_timestamp(datetime.now(timezone.utc))


@dataclass(frozen=True)
class Repository:
    """The coordinator checkout: its top level and the git common dir shared by its worktrees."""

    root: Path
    common_dir: Path


def locate_repository(start: str | os.PathLike[str]) -> Repository:
    """One spawn: the worktree top level and the common dir; a clear error outside a repository."""
    path = Path(start).resolve()
    if not path.is_dir():
        raise ServiceError("not_a_git_repository", f"{path} is not a directory; pass --root DIR of a git checkout")
    found = find_checkout(path)
    if found is not None:  # read from git's own files: no spawn
        return Repository(root=found.top, common_dir=found.common_dir)
    from lanes_es.adapters.git import git_ok

    result = git_ok(str(path), "rev-parse", "--path-format=absolute", "--show-toplevel", "--git-common-dir")
    if result.exit_code != 0:
        said = result.stderr.decode("utf-8", "replace")
        if "dubious ownership" in said:  # git 2.35.2+: a repository another user owns (safe.directory)
            owner = said.split("repository at '", 1)[-1].split("'", 1)[0] if "repository at '" in said else str(path)
            raise ServiceError("repository_not_owned",
                               f"git refuses the repository at {owner}: another user owns it (git's safe.directory "
                               f"rule); run lanes-es as its owner, or trust it with `git config --global --add "
                               f"safe.directory {owner}`")
        raise ServiceError("not_a_git_repository",
                           f"{path} is not inside a git repository; run lanes-es in the coordinator checkout "
                           f"or pass --root DIR")
    top, common = result.text.splitlines()[:2]
    return Repository(root=Path(top).resolve(), common_dir=Path(common).resolve())


class RealAdapters:
    """Real git, the reference kernel and process runners, built fresh for each tick."""

    def __init__(self, clock: Any = system_now, common_dir: Path | None = None) -> None:
        self.clock = clock
        self.common_dir = common_dir

    def anchor_log(self, root: str, batch_id: str, version: int, read_rows: Any) -> Any:
        """The signed checkpoint and attestations on refs/lanes-es/checkpoints/<batch> (needs the audit extra)."""
        from lanes_es.audit.signing import AuditExtraMissing, audit_extra_missing

        if self.common_dir is None:
            return None
        missing = audit_extra_missing()
        if missing is not None:  # said on every tick that appends, so that a missing checkpoint is never a mystery
            raise AuditExtraMissing(missing)
        from lanes_es.adapters.anchor_git import GitAnchor
        from lanes_es.adapters.anchored_marker import anchored_dir
        from lanes_es.adapters.signing_key import load_signer
        from lanes_es.audit.anchor import anchor_log

        common_dir = self.common_dir
        return anchor_log(GitAnchor(anchored_dir(common_dir)), root, batch_id, version, read_rows,
                          lambda: load_signer(common_dir))

    def tick_ports(self, root: str, slug: str) -> TickPorts:
        from lanes_es.adapters.batch_git import GitBatch
        from lanes_es.adapters.check_runner import LocalCheckRunner
        from lanes_es.adapters.final_verification import ProcessVerifier
        from lanes_es.adapters.kernel import ReferenceKernel
        from lanes_es.adapters.candidate_git import GitCandidates
        from lanes_es.adapters.lane_git import GitLaneInspector
        from lanes_es.adapters.leak_restore import GitLeakRestorer
        from lanes_es.adapters.runtime_contracts import ManifestRuntimeContracts
        from lanes_es.adapters.plan_observer import CoordinatorPlan
        from lanes_es.adapters.tracker import CommandTracker
        from lanes_es.tick_input import TickPorts

        kernel = ReferenceKernel(clock=self.clock)
        batch_git = GitBatch()
        command = os.environ.get("LANES_ES_TRACKER_COMMAND")
        return TickPorts(kernel=kernel, batch_git=batch_git, lanes=GitLaneInspector(), candidates=GitCandidates(),
                         verifier=ProcessVerifier(),
                         check_runner=LocalCheckRunner(),
                         tracker=CommandTracker(command) if command else None, leaks=GitLeakRestorer(),
                         runtime_contracts=ManifestRuntimeContracts(),
                         revisions=kernel if hasattr(kernel, "apply_delegated_revision") else None,
                         plans=CoordinatorPlan(self.read_initiative, batch_git, kernel))

    def on_cluster(self, ports: TickPorts, runner: str, batch_id: str) -> TickPorts:
        """`ports` with the batch's candidate checks on the Ray cluster `runner` (`ray://HOST:PORT`), every
        attempt noted for the log (lanes_es/adapters/ray_checks.py); RayUnavailable when it cannot be used."""
        from lanes_es.adapters.ray_checks import RayChecks

        checks = RayChecks(runner, batch_id)
        ports.check_runner = ports.remote = checks
        ports.kernel.run_qa = checks.run_qa  # a Lane's QA: its files go to a node, its verdict comes back
        return ports

    def remote_attempts(self, runner: str, batch_id: str) -> Any:
        """How the autopilot reaches the Ray cluster `runner` for Executor attempts: connect(journal), a runner
        whose notes go to `journal` (lanes_es/steward/remote_run.py)."""
        from lanes_es.adapters.ray_runner import RayCheckRunner

        return lambda journal: RayCheckRunner(runner, batch_id, journal)

    def coordinators(self) -> Any:
        from lanes_es.adapters.coordinator_git import GitCoordinators

        return GitCoordinators()

    def head(self, root: str) -> str:
        from lanes_es.adapters.git import git_ok

        result = git_ok(root, "rev-parse", "--verify", "HEAD^{commit}")
        if result.exit_code != 0:
            raise ServiceError("uncommitted_head", f"{root} has no commit yet; commit the base before authorizing")
        return result.text

    def ensure_state_ignored(self, root: str) -> bool:
        from lanes_es.adapters.git import git, git_ok

        if git_ok(root, "check-ignore", "-q", ".imm/state/batches").exit_code == 0:
            return False
        exclude = Path(git(root, "rev-parse", "--git-path", "info/exclude").text)
        if not exclude.is_absolute():
            exclude = Path(root) / exclude
        exclude.parent.mkdir(parents=True, exist_ok=True)
        with open(exclude, "a+b") as handle:  # only its last byte is read: whether it ends its last line
            size = handle.seek(0, os.SEEK_END)
            last = b"\n"
            if size:
                handle.seek(size - 1)
                last = handle.read(1)
            handle.write((b"" if last == b"\n" else b"\n") + b".imm/state/\n")
        return True

    def repository_identity(self, root: str) -> "RepositoryIdentity":
        """Read from the files now: the checkout `root` is in and its repository id (never made here)."""
        from lanes_es.adapters.store_open import repository_id
        from lanes_es.domain.repository import RepositoryIdentity

        repository = locate_repository(root)
        return RepositoryIdentity(repository_id=repository_id(repository.common_dir, create=False),
                                  checkout=str(repository.root))

    def read_initiative(self, root: str, slug: str) -> dict[str, Any]:
        from lanes_es.adapters.initiative_reader import read_local_initiative

        return read_local_initiative(root, slug)


def open_store(repository: Repository, url: str | None = None, read_only: bool = False) -> EventStore:
    """The store of `url` (else $LANES_ES_STORE, else the repository's); `read_only` for commands that only read.
    Neither the store nor this clone's repository id is made before the command's first append."""
    from lanes_es.adapters.store_open import RepositoryIdToMake, repository_id

    resolved = store_url_from_env(url, repository.common_dir)
    if not read_only and resolved != default_store_url(repository.common_dir):
        from lanes_es.adapters.store_open import refuse_unmade_place

        refuse_unmade_place(resolved, repository.root)
    from lanes_es.adapters.anchored_marker import anchored_dir, anchored_tip

    anchored = anchored_dir(repository.common_dir)
    known = repository_id(repository.common_dir, create=False)
    to_make = RepositoryIdToMake(repository.common_dir) if known is None and not read_only else None
    return EventStore(resolved, lock_dir=repository.common_dir / "lanes-es" / "locks", read_only=read_only,
                      repository_id=known, owns_checkout=lambda path: _same_repository(repository, path),
                      anchored=lambda batch_id: anchored_tip(anchored, batch_id), id_to_make=to_make,
                      made_by_first_save=True)


def _same_repository(repository: Repository, path: str) -> bool:
    """Whether a checkout path (as an authorization recorded it) is a worktree of `repository` on this machine."""
    if Path(path) == repository.root:
        return True
    return Path(path).is_dir() and common_dir_of(path) == repository.common_dir.resolve()


def bootstrap(root: str | os.PathLike[str] = ".", store_url: str | None = None,
              clock: Any = system_now, read_only: bool = False) -> Deps:
    """The real ports for a command run in `root`: its checkout, its store (`store_url`, else
    $LANES_ES_STORE, else the repository's own), the real adapters and `clock`."""
    repository = locate_repository(root)
    try:
        store = open_store(repository, store_url, read_only)
    except GitFailure as error:
        raise ServiceError("store_unavailable", str(error)) from None
    return Deps(root=str(repository.root), store=store, adapters=RealAdapters(clock, repository.common_dir),
                now=clock, stats_path=os.environ.get("LANES_ES_STATS"))
