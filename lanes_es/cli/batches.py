"""`lanes-es batches` (the read model: every batch of every repository sharing the store) and
`lanes-es rebuild --all` (the projections of every batch this checkout coordinates and the read model, with a
progress bar).

The progress bar is rich's (`rich.progress`): drawn on stderr only when it is a terminal.
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from lanes_es.errors import ServiceError

EXIT_DRIFT = 1


def register(commands: Any) -> None:
    command = commands.add_parser(
        "batches", help="list every batch in the store: repository, state, children by status",
        description="The read model: one line per batch of every repository sharing the store (id, Initiative, "
                    "repository, state, children by status, last event time), kept by following the store's "
                    "notification log. It catches up with the log before it answers.")
    command.add_argument("--state", default=None, metavar="S", help="only batches in this state (running, "
                         "needs_human, completed, authorized, ...)")
    command.add_argument("--repo", default=None, metavar="R",
                         help="only batches of this repository (its path, or the last part of it)")
    command.add_argument("--json", action="store_true", help="print the lines as JSON")
    command.set_defaults(func=_batches)


def _read_model(store: Any) -> Any:
    from lanes_es.adapters.read_model import ReadModel

    if store.url == "memory:":
        raise ServiceError("invalid_input", "a memory: store keeps no read model; use a SQLite path or "
                                            "postgresql://... with --store")
    return ReadModel(store)


def _batches(args: argparse.Namespace) -> int:
    lines = _summaries(args)
    if args.json:
        print(json.dumps([line.as_json() for line in lines], indent=2))
        return 0
    if not lines:
        print("no batch" + (" matches" if args.state or args.repo else " in this store yet") +
              "; `lanes-es authorize SLUG` starts one")
        return 0
    for line in lines:
        children = ", ".join(f"{count} {state}" for state, count in line.children_by_status().items())
        print(f"{line.batch_id}  {line.batch_state:<14} {line.last_event_at}  {line.repository or '-'}  "
              f"[{children}]")
    return 0


def _summaries(args: argparse.Namespace) -> list[Any]:
    """The read model's lines; on a store this user cannot write, or none yet, folded from the log in memory
    (writes nothing)."""
    from lanes_es.adapters.read_model import fold_from_scratch, select_lines
    from lanes_es.cli.main import deps_of

    store = deps_of(args, read_only=True).store
    try:
        if not store.writable:
            return select_lines(list(fold_from_scratch(store).values()), args.state, args.repo)
        with _read_model(store) as model:
            return model.summaries(state=args.state, repository=args.repo)
    finally:
        store.close()


# ---------------------------------------------------------------- rebuild --all


@contextmanager
def progress_bar(label: str) -> Iterator[Callable[[int, int], None]]:
    """A rich progress bar on stderr, shown only on a terminal; yields `update(done, total)`."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    console = Console(stderr=True)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=console, transient=True, disable=not console.is_terminal) as progress:
        task = progress.add_task(label, total=None)

        def update(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        yield update


def rebuild_all(deps: Any, check: bool, out: Any = None) -> int:
    """This checkout's batches' projections and the read model against the log; exit 1 when anything drifted.
    A shared store's other batches have their projections in the checkouts coordinating them: neither judged
    nor written here."""
    from lanes_es.usecases.coordinator import batch_root
    from lanes_es.usecases.rebuild import rebuild

    out = out or sys.stdout
    batch_ids, elsewhere = _batches_here(deps)
    if elsewhere:
        out.write(f"{elsewhere} batch(es) of other checkouts sharing the store left to them (`lanes-es rebuild --all` "
                  f"in each)\n")
    drifted = False
    with progress_bar("projections") as update:
        for done, batch_id in enumerate(batch_ids, start=1):
            root = batch_root(deps.store, deps.root, batch_id)  # its coordinator worktree while there is one
            items = rebuild(deps.store, root, [batch_id], check=check)[batch_id]
            drifted = drifted or bool(items)
            if check:
                out.write(f"{batch_id}: " + ("; ".join(items) if items else "no drift") + "\n")
            else:
                out.write(f"{batch_id}: " + (f"rewrote {', '.join(items)}" if items else "already matches the log")
                          + "\n")
            update(done, len(batch_ids))
    if deps.store.url != "memory:" and deps.store.made:  # a store not made yet has no read model to judge
        drifted = _read_model_drift(deps.store, check, out) or drifted
    return EXIT_DRIFT if drifted else 0


def _batches_here(deps: Any) -> tuple[list[str], int]:
    """The ids of the batches coordinated from this checkout, and how many others the store holds."""
    from lanes_es.domain.drift import coordinated_here

    here, shared = deps.repository_opened(), deps.store_is_shared()
    found = deps.store.batch_authorizations()
    own = [batch_id for batch_id, authorization in found.items() if coordinated_here(authorization, here, shared)]
    return own, len(found) - len(own)


def _read_model_drift(store: Any, check: bool, out: Any) -> bool:
    from lanes_es.adapters.read_model import caught_up_in_memory, fold_from_scratch

    if check and not store.writable:  # a check writes nothing: catch the view up in memory instead
        with progress_bar("read model") as update:
            expected = fold_from_scratch(store, progress=update)
        differing = _differing(expected, caught_up_in_memory(store))
    else:
        with _read_model(store) as model:
            model.catch_up()
            with progress_bar("read model") as update:
                expected = fold_from_scratch(store, progress=update)
            differing = _differing(expected, {line.batch_id: line for line in model.lines()})
            if not check:
                with progress_bar("read model") as update:
                    model.rebuild(progress=update)
    if differing:
        verb = "differs from" if check else "differed from (rebuilt)"
        out.write(f"read model: {len(differing)} line(s) {verb} the log: {', '.join(differing[:10])}"
                  + (" ..." if len(differing) > 10 else "") + "\n")
    else:
        out.write(f"read model: {len(expected)} batch line(s), no drift\n")
    return bool(differing)


def _differing(expected: dict[str, Any], actual: dict[str, Any]) -> list[str]:
    return sorted(batch_id for batch_id in expected.keys() | actual.keys() if expected.get(batch_id) != actual.get(batch_id))
