"""Where a batch's coordinator is (docs/concepts/coordinator.md): a worktree of its own by default, so that
the user's checkout is never switched, staged, restored, cleaned or judged while the batch runs.

A new batch is confirmed in the coordinator worktree `for_new_batch` makes or reuses (the user's HEAD,
committed: what a batch runs); its authorization records where it is, and every later command finds
it there (`at_coordinator`). `--coordinator .` (or LANES_ES_COORDINATOR=.) keeps upstream's in-place mode,
and a batch recorded in place (no coordinator in its log) goes on in place.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator

from lanes_es.domain import events as ev
from lanes_es.domain.ids import batch_branch_name
from lanes_es.domain.record import is_terminal
from lanes_es.errors import ServiceError
from lanes_es.usecases.deps import Deps
from lanes_es.usecases.load import check_slug, current_authorization

IN_PLACE = "."


def default_place(deps: Deps, slug: str) -> Path:
    """lanes-es's own place for an Initiative's coordinator: under the git common dir, beside its store."""
    common_dir = getattr(deps.adapters, "common_dir", None)
    base = Path(common_dir) if common_dir is not None else Path(deps.root) / ".git"
    return base / "lanes-es" / "coordinators" / slug


def chosen_place(deps: Deps, slug: str, where: str | None = None) -> Path | None:
    """Where a new batch's coordinator goes: `where` (`.`: in place), else $LANES_ES_COORDINATOR, else
    lanes-es's place; None when that is the command's own checkout (in place)."""
    where = where if where is not None else (os.environ.get("LANES_ES_COORDINATOR") or None)
    if where == IN_PLACE:
        return None
    path = Path(where).resolve() if where else default_place(deps, slug)
    return None if path == Path(deps.root) else path


def for_new_batch(deps: Deps, slug: str, where: str | None = None) -> Deps:
    """The ports a confirmation (authorize, run, the MCP start tool) runs with: an open batch's recorded
    coordinator; for a new batch, `where` (`.`: in place; a directory; None: $LANES_ES_COORDINATOR, else
    lanes-es's place), made or reused at the user's HEAD."""
    check_slug(slug)
    current = current_authorization(deps, slug)
    recorded = deps.store.batch(current.batch_id) if current is not None else None
    if recorded is not None and not is_terminal(recorded.batch_state):
        return at_coordinator(deps, current, restore=True)  # type: ignore[arg-type]
    if current is not None and recorded is None and current.coordinator is None and where is None:
        return deps  # authorized in place, never ticked: confirmed again in place
    if (current is not None and recorded is None and current.coordinator is not None and where is None
            and (not Path(current.coordinator).exists() or _of_this_repository(deps, current.coordinator))):
        where = current.coordinator
    path = chosen_place(deps, slug, where)
    if path is None:
        return deps
    head = deps.adapters.head(deps.root)
    deps.adapters.coordinators().prepare(deps.root, str(path), batch_branch_name(slug), head, slug)
    return replace(deps, root=str(path.resolve()), checkout=deps.root)


@contextmanager
def confirming(deps: Deps, slug: str, where: str | None = None) -> Iterator[Deps]:
    """`for_new_batch`, for a command that confirms: a coordinator worktree this call made is removed again when
    the command leaves it with no authorization recording it (refused at the gate, the user's no, a plan or HEAD
    moved while asked, a refused run), so that a refusal writes nothing. One made by another command is left."""
    common_dir = getattr(deps.adapters, "common_dir", None)
    before = _worktrees(Path(common_dir)) if common_dir is not None else None
    ported = for_new_batch(deps, slug, where)
    made = before is not None and ported.checkout is not None and Path(ported.root).resolve() not in before
    try:
        yield ported
    finally:
        if made:
            current = current_authorization(ported, slug)
            if current is None or current.coordinator != ported.root:
                ported.adapters.coordinators().remove_if_clean(deps.root, ported.root)


def forget_unconfirmed(deps: Deps, slug: str) -> None:
    """Over MCP the question and its answer are two calls, so `confirming` cannot span them: when the answer
    refuses (declined, cancelled, no gate, the facts moved), the coordinator worktree made for the question is
    removed here when it is clean and no authorization records it, so that a refusal writes nothing."""
    path = chosen_place(deps, slug)
    if path is None or not path.exists():
        return
    path = path.resolve()
    current = current_authorization(deps, slug)
    if current is not None and current.coordinator is not None and Path(current.coordinator).resolve() == path:
        return
    deps.adapters.coordinators().remove_if_clean(deps.root, str(path))


def _worktrees(common_dir: Path) -> set[Path]:
    """The linked worktrees git has registered, read from its own files (no spawn)."""
    from lanes_es.adapters.files import read_capped_text

    found: set[Path] = set()
    for entry in (common_dir / "worktrees").glob("*/gitdir"):
        try:
            found.add(Path(read_capped_text(entry, 4096, "utf-8").strip()).parent.resolve())
        except (OSError, ValueError):
            continue
    return found


def at_coordinator(deps: Deps, authorization: ev.BatchAuthorized | None, *, restore: bool = False) -> Deps:
    """The ports of a command on a recorded batch, rooted at its coordinator as its authorization records it:
    unchanged for a batch recorded in place, or for a coordinator of another repository (a shared store read
    from another clone, which the repository guard refuses). With `restore`, a coordinator removed by hand is
    made again (a batch still running); without, a removed one is refused (`coordinator_removed`)."""
    if authorization is None or authorization.coordinator is None:
        return deps
    path = authorization.coordinator
    if Path(path) == Path(deps.root):
        return replace(deps, checkout=deps.checkout or authorization.repository)
    if deps.checkout is not None:
        return deps  # already rooted at a coordinator
    if (Path(path) / ".git").exists():
        if not _of_this_repository(deps, path):
            return deps
        return replace(deps, root=path, checkout=deps.root)
    if authorization.repository is not None and Path(authorization.repository) != Path(deps.root):
        return deps  # recorded from another checkout: the repository guard says so
    if restore and deps.adapters.coordinators().restore(deps.root, path, authorization.branch,
                                                        authorization.base_head):
        return replace(deps, root=path, checkout=deps.root)
    raise ServiceError("coordinator_removed",
                       f"the coordinator worktree {path} of batch {authorization.batch_id} is gone; nothing was "
                       f"done: `lanes-es status {_slug(authorization)}` shows the batch (its log keeps it all)")


def coordinator_of(deps: Deps, slug: str) -> Deps:
    """The ports of a command on the Initiative's current batch (tick, retire, rebuild, status)."""
    return at_coordinator(deps, current_authorization(deps, slug))


def remove_coordinator(deps: Deps, authorization: ev.BatchAuthorized | None) -> str:
    """Remove a terminal batch's coordinator worktree when it holds nothing uncommitted; what was done, in words."""
    if authorization is None or authorization.coordinator is None:
        return ""
    path = authorization.coordinator
    if not (Path(path) / ".git").exists():
        return f"its coordinator worktree {path} is already gone"
    kept = deps.adapters.coordinators().remove_if_clean(deps.user_checkout, path)
    if kept is None:
        return f"removed its coordinator worktree {path}"
    return f"kept its coordinator worktree {path}: {kept} (take what you need, then `git worktree remove {path}`)"


def _of_this_repository(deps: Deps, path: str) -> bool:
    from lanes_es.adapters.git_dirs import common_dir_of

    common_dir = getattr(deps.adapters, "common_dir", None)
    found = common_dir_of(path)
    if common_dir is None or found is None:
        return True
    return found == Path(common_dir).resolve()


def _slug(authorization: ev.BatchAuthorized) -> str:
    return authorization.branch.split("/", 1)[-1]


def authorization_of(store: Any, batch_id: str) -> ev.BatchAuthorized | None:
    """The authorization that named `batch_id` (its Initiative read by the slug in the id, `batch-SLUG-UUID`)."""
    if not batch_id.startswith("batch-") or len(batch_id) <= len("batch-") + 37:
        return None
    slug = batch_id[len("batch-"):-37]
    try:
        found = store.initiative(slug)
    except (ValueError, KeyError):
        return None
    for authorization in reversed(found.authorizations if found is not None else []):
        if authorization.batch_id == batch_id:
            return authorization
    return None


def batch_root(store: Any, root: str | Path, batch_id: str) -> str:
    """Where a recorded batch's projections are: its coordinator worktree while there is one, else `root` (in
    place, or after `land` wrote them into the user's checkout and removed the worktree)."""
    authorization = authorization_of(store, batch_id)
    path = authorization.coordinator if authorization is not None else None
    if path is not None and (Path(path) / ".git").exists():
        return path
    return str(root)
