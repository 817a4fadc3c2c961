"""`lanes-es initiative new` and `lanes-es initiative add-task`: an Initiative and its tasks, written for you.

They write upstream's files in the coordinator checkout: `docs/initiatives/<slug>.md` and, per
task, `docs/plans/<task>.intent.json` (TaskIntent v1, each check encoded as a verification
descriptor v2). They commit nothing: a batch runs what is committed, so the next step is yours.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Any

from lanes_es.domain.authoring import (DEFAULT_TIMEOUT_SECONDS, AuthoringError, initiative_tasks, intent_text,
                                       new_initiative_text, task_intent, unmatched_scope, with_task)
from lanes_es.domain.ids import is_valid_id
from lanes_es.domain.initiative_file import local_initiative_path
from lanes_es.domain.intent import RISKS
from lanes_es.errors import Refusal

GROUP_DESCRIPTION = """\
Write an Initiative and its tasks in upstream's formats, so that nothing is encoded by hand:

  lanes-es initiative new greeting --title "Greeting"
  lanes-es initiative add-task greeting greet --goal "Write greet(name)" --scope greet.py \\
      --check "python3 -c 'from greet import greet; assert greet(\\"Ada\\") == \\"Hello, Ada!\\"'"
  git add docs && git commit -m "Initiative greeting"
  lanes-es plan greeting

The files are docs/initiatives/SLUG.md and docs/plans/TASK.intent.json in the coordinator
checkout; edit them freely afterwards. Nothing is committed for you."""


class AuthoringRefused(Refusal):
    """An Initiative or task that cannot be written as asked."""


def register(commands: Any) -> None:
    group = commands.add_parser("initiative", help="write an Initiative and its tasks' intents (new, add-task)",
                                description=GROUP_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    group.set_defaults(func=lambda args: _usage(group))
    verbs = group.add_subparsers(title="initiative commands", metavar="INITIATIVE_COMMAND")

    new = verbs.add_parser("new", help="write docs/initiatives/SLUG.md, an Initiative with no task yet",
                           description="Write a new Initiative, docs/initiatives/SLUG.md, holding only its title. "
                                       "Add its tasks with `lanes-es initiative add-task SLUG TASK ...`.")
    new.add_argument("slug", metavar="SLUG", help="the Initiative's name: letters, digits, '.', '_', '-'")
    new.add_argument("--title", default=None, help="its title (default: the slug)")
    new.set_defaults(func=_new)

    add = verbs.add_parser(
        "add-task", help="add a task: its slice in the Initiative and its docs/plans/TASK.intent.json",
        description="Add a task to an Initiative: a slice naming it (and what it waits for) in "
                    "docs/initiatives/SLUG.md, and its TaskIntent docs/plans/TASK.intent.json with each --check "
                    "written as the verification descriptor upstream's format asks for. A check is a command line "
                    "as you would type it; it runs without a shell, from the repository's top level, and passes "
                    "when it exits 0.")
    add.add_argument("slug", metavar="SLUG", help="the Initiative (made by `lanes-es initiative new SLUG`)")
    add.add_argument("task", metavar="TASK", help="the new task's id: letters, digits, '.', '_', '-'")
    add.add_argument("--goal", required=True, metavar="TEXT", help="what the task delivers, for its Executor")
    add.add_argument("--scope", required=True, action="extend", nargs="+", metavar="PATH",
                     help="the repository paths the task may change (a directory covers what is under it; * and ? "
                          "match within a segment); tasks whose scopes overlap never run at once; repeatable")
    add.add_argument("--check", required=True, action="append", metavar="CMD",
                     help="a command that exits 0 when the task is done, e.g. \"python3 -m pytest -q tests\" "
                          "(no shell: no pipes, redirections or $VARIABLES); repeatable")
    add.add_argument("--blocked-by", action="extend", nargs="+", default=[], metavar="TASK",
                     help="tasks of this Initiative that must be integrated before this one starts")
    add.add_argument("--risk", choices=RISKS, default="routine",
                     help="routine (done when the checks pass; default), material or critical (a Review follows, "
                          "`lanes-es task review` in the Lane)")
    add.add_argument("--title", default=None, metavar="TEXT", help="the slice's heading (default: the goal's first line)")
    add.add_argument("--check-timeout", type=int, default=DEFAULT_TIMEOUT_SECONDS, metavar="SECONDS",
                     help=f"how long each check may run before it is killed and fails (1 to 600; default "
                          f"{DEFAULT_TIMEOUT_SECONDS})")
    add.set_defaults(func=_add_task)


def _usage(group: argparse.ArgumentParser) -> int:
    group.print_help()
    return 2


def _root(args: argparse.Namespace) -> Path:
    from lanes_es.bootstrap import locate_repository

    return locate_repository(args.root).root


def _new(args: argparse.Namespace) -> int:
    if not is_valid_id(args.slug):
        raise AuthoringRefused(f"invalid_slug: {args.slug!r} is not an Initiative name; use letters, digits, '.', "
                               f"'_' and '-', starting with a letter or digit")
    root = _root(args)
    relative = local_initiative_path(args.slug)
    path = root / relative
    if path.exists():
        raise AuthoringRefused(f"initiative_exists: {relative} already exists; add tasks with `lanes-es initiative "
                               f"add-task {args.slug} TASK ...`, or choose another name")
    try:
        text = new_initiative_text(args.title or args.slug)
    except AuthoringError as error:
        raise AuthoringRefused(f"invalid_initiative: {error}") from None
    _write(path, text)
    print(f"wrote {relative}")
    print(f"next: lanes-es initiative add-task {args.slug} TASK --goal TEXT --scope PATH --check CMD")
    return 0


def _add_task(args: argparse.Namespace) -> int:
    root = _root(args)
    relative = local_initiative_path(args.slug)
    initiative = root / relative
    if not is_valid_id(args.slug) or not initiative.is_file():
        raise AuthoringRefused(f"initiative_not_found: there is no {relative}; make it with "
                               f"`lanes-es initiative new {args.slug}`")
    intent_relative = f"docs/plans/{args.task}.intent.json"
    if is_valid_id(args.task) and (root / intent_relative).exists():
        raise AuthoringRefused(f"intent_exists: {intent_relative} already exists; edit it (raise its revision), or "
                               f"choose another task id")
    if not 1 <= args.check_timeout <= 600:
        raise AuthoringRefused("invalid_check_timeout: --check-timeout is 1 to 600 seconds")
    scope = [(entry[2:] if entry.startswith("./") else entry).rstrip("/") or entry for entry in args.scope]
    text = initiative.read_text(encoding="utf-8")
    title = args.title or (args.goal.strip().splitlines() or [args.task])[0]
    try:
        updated = with_task(text, args.slug, relative, args.task, title, args.blocked_by)
        intent = task_intent(args.task, args.goal, scope, args.check, args.risk, args.check_timeout)
    except AuthoringError as error:
        raise AuthoringRefused(f"invalid_task: {error}") from None
    _write(root / intent_relative, intent_text(intent))
    _write(initiative, updated)
    slice_id = initiative_tasks(updated, args.slug, relative)[-1]["slice_id"]
    print(f"wrote {intent_relative}")
    print(f"added {args.task} to {relative} (slice {slice_id}"
          + (f", blocked by {', '.join(args.blocked_by)})" if args.blocked_by else ")"))
    for entry in unmatched_scope(scope, tree_paths(str(root))):
        print(f"note: scope entry {entry} matches no committed file yet (fine for a file the task creates; "
              f"check its spelling otherwise)")
    running = _running_batch(args)
    if running:
        print(f"note: batch {running} of {args.slug} is running; once this is committed its plan has changed, and "
              f"its next tick parks it (batch_plan_digest_changed): let it finish first, or `lanes-es retire "
              f"{args.slug}` and run the new plan as a new batch")
    print(f"next: git add docs && git commit -m {shlex.quote(f'Initiative {args.slug}: {args.task}')}, "
          f"then lanes-es plan {args.slug}")
    return 0


def _running_batch(args: argparse.Namespace) -> str | None:
    """The Initiative's batch that is not settled yet, if the store has one (no store: none)."""
    from lanes_es.cli.main import deps_of
    from lanes_es.domain.record import is_terminal
    from lanes_es.usecases.load import active_batch

    try:
        batch = active_batch(deps_of(args, read_only=True), args.slug)
    except (Refusal, OSError):
        return None
    return batch.id if batch is not None and not is_terminal(batch.batch_state) else None


def tree_paths(root: str) -> list[str]:
    """The files of HEAD's tree (what a Lane is cut from); none before the first commit."""
    from lanes_es.adapters.git import git_ok

    listed = git_ok(root, "ls-tree", "-r", "-z", "--name-only", "HEAD")
    return [path for path in listed.stdout.decode("utf-8", "surrogateescape").split("\0") if path] \
        if listed.exit_code == 0 else []


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


__all__ = ["register", "tree_paths"]
