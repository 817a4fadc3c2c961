"""`lanes-es task ...`: the Executor's commands, run inside a Lane.

The Lane is the git worktree the current directory (or --root) is in; its task is named by
its branch `imm-lane/<slug>/<task>` (docs/upstream.md#lane-identification). Each command
reads or changes only that Lane's kernel store (`.imm/state/kernel/`).

Exit codes (lanes_es/exit_codes.py): 0 done (or QA passed), 1 `task check` found failures,
2 a refusal or not in a Lane, 70 an internal error.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Any, Callable

import msgspec

from lanes_es.adapters.git_dirs import find_checkout
from lanes_es.adapters.kernel import ReferenceKernel, TaskStatus
from lanes_es.adapters.qa import Verdict
from lanes_es.errors import Refusal
from lanes_es.exit_codes import EXIT_FINDING, EXIT_OK, EXIT_REFUSED
from lanes_es.ports import KernelError

PARKED_STATES = ("needs_human", "parked", "failed", "budget_stopped")
LANE_REF = re.compile(r"^refs/heads/imm-lane/[^/]+/([A-Za-z0-9][A-Za-z0-9._-]{0,127})$")

GROUP_HELP = "the Executor's commands inside a Lane: status, check, submit, review, stop"
GROUP_DESCRIPTION = """\
Run these inside the Lane the coordinator handed you (a git worktree on branch
imm-lane/<slug>/<task>). The usual round:

  lanes-es task status          what the task needs next
  lanes-es task check           run the task's acceptance checks on your work, changing nothing
  lanes-es task submit          freeze the work; the coordinator's next tick runs QA on it

A failed QA makes the work active again (see `task status` for the findings); fix and
submit again. A material task then waits for a Review: `task review --approve` or
`task review --reject TEXT`. `task stop --reason TEXT` gives the task up for good.

Exit codes: 0 done or QA passed, 1 `check` found failures, 2 refused or not in a Lane,
70 internal error."""


class NotInLane(Refusal):
    """The current directory is not inside a Lane worktree."""


def register(subparsers: Any) -> None:
    """Add the `task` command group to the main parser's subparsers."""
    group = subparsers.add_parser("task", help=GROUP_HELP, description=GROUP_DESCRIPTION,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    group.set_defaults(func=lambda args: _usage(group))
    commands = group.add_subparsers(title="task commands", metavar="TASK_COMMAND")

    status = commands.add_parser("status", help="show the task's lifecycle, findings and next step",
                                 description="Show the Lane's task: lifecycle, artifact state, next obligation, "
                                             "the open Review and the latest QA findings, and what to do next.")
    status.add_argument("--json", action="store_true", help="print the status as JSON")
    status.set_defaults(func=run_status)

    check = commands.add_parser("check", help="run the acceptance checks on your work without changing state",
                                description="Run the task's acceptance descriptors on a copy of this Lane's "
                                            "tracked and untracked files, as the coordinator's QA will. Nothing "
                                            "is recorded. Exit 0 when every check passes, 1 otherwise.")
    check.add_argument("--json", action="store_true", help="print the verdict as JSON")
    check.set_defaults(func=run_check)

    submit = commands.add_parser("submit", help="freeze the work for the coordinator's QA",
                                 description="Freeze the task's artifact: the work in this Lane is ready. The "
                                             "coordinator's next tick runs QA on it; do not change files after "
                                             "submitting. Run `lanes-es task check` first.")
    submit.set_defaults(func=run_submit)

    review = commands.add_parser("review", help="record the verdict of the open Review (material tasks)",
                                 description="Record the verdict of the task's open Review reservation. The "
                                             "coordinator applies it on its next tick: an approval completes the "
                                             "task, a rejection sends it back to work.")
    verdict = review.add_mutually_exclusive_group(required=True)
    verdict.add_argument("--approve", action="store_true", help="approve the delivered work")
    verdict.add_argument("--reject", metavar="TEXT", help="reject it, saying what to rework")
    review.set_defaults(func=run_review)

    stop = commands.add_parser("stop", help="give the task up for good",
                               description="Stop the task: it will not complete, and the coordinator parks it "
                                           "for a human. The Lane and its files are kept.")
    stop.add_argument("--reason", metavar="TEXT", required=True, help="why the task stops")
    stop.set_defaults(func=run_stop)


# ---------------------------------------------------------------- commands


def run_status(args: argparse.Namespace) -> int:
    return _in_lane(args, lambda kernel, lane, task: _show_status(kernel.status(lane, task), lane, args.json,
                                                                   coordinator_view(lane, task)))


def coordinator_view(lane: str, task: str) -> dict[str, Any] | None:
    """The task's entry in its batch's record, from the store the Lane shares with the coordinator.

    The Lane's kernel says `done` once QA passed; only the batch knows that the coordinator
    parked the task afterwards (a scope violation at the lane commit, say). None when the
    batch cannot be read: the Lane's own status still stands.
    """
    found = find_checkout(lane)
    head = found.head_ref() if found is not None else None
    if found is None or head is None or not head.startswith("refs/heads/imm-lane/"):
        return None
    slug = head.split("/")[3]
    try:
        from lanes_es.adapters.store import EventStore, store_url_from_env
        from lanes_es.adapters.store_open import repository_id
        from lanes_es.errors import Refusal

        store = EventStore(store_url_from_env(None, found.common_dir), read_only=True,
                           repository_id=repository_id(found.common_dir, create=False))
        initiative = store.initiative(slug)
        batch = store.batch(initiative.current.batch_id) if initiative and initiative.current else None
    except (Refusal, OSError):
        return None
    children = batch.record.get("children", []) if batch is not None else []
    child = next((entry for entry in children if entry.get("task_id") == task), None)
    return {"initiative_slug": slug, "batch_id": batch.id, **child} if child is not None else None


def run_check(args: argparse.Namespace) -> int:
    return _in_lane(args, lambda kernel, lane, task: _show_verdict(kernel.check(lane, task), args.json))


def run_submit(args: argparse.Namespace) -> int:
    def submit(kernel: ReferenceKernel, lane: str, task: str) -> int:
        record = kernel.submit(lane, task)
        print(f"submitted {task} (record revision {record.record_revision}); the coordinator runs QA on its next tick")
        return EXIT_OK

    return _in_lane(args, submit)


def run_review(args: argparse.Namespace) -> int:
    def review(kernel: ReferenceKernel, lane: str, task: str) -> int:
        approve = bool(args.approve)
        kernel.review(lane, approve=approve, text="" if approve else args.reject, task_id=task)
        verdict = "approval" if approve else "rejection"
        print(f"recorded the Review {verdict} for {task}; the coordinator applies it on its next tick")
        return EXIT_OK

    return _in_lane(args, review)


def run_stop(args: argparse.Namespace) -> int:
    def stop(kernel: ReferenceKernel, lane: str, task: str) -> int:
        kernel.stop(lane, args.reason, task_id=task)
        print(f"stopped {task}; the coordinator parks it for a human, and this Lane is kept")
        return EXIT_OK

    return _in_lane(args, stop)


# ---------------------------------------------------------------- Lane identification


def locate_lane(start: str) -> tuple[str, str]:
    """(the Lane's top level, its task id), read from git's files or from one git spawn; NotInLane otherwise."""
    found = find_checkout(start)
    head = found.head_ref() if found is not None else None
    if found is not None and head is not None:
        lines = [str(found.top), head]
    else:
        from lanes_es.adapters.git import git_ok

        result = git_ok(start, "rev-parse", "--show-toplevel", "--symbolic-full-name", "HEAD")
        lines = result.text.splitlines() if result.exit_code == 0 else []
    if len(lines) < 2:
        raise NotInLane(f"{os.path.abspath(start)} is not inside a git worktree; run `lanes-es task ...` inside the Lane the "
                        "coordinator handed you (a worktree on branch imm-lane/<slug>/<task>), or pass --root LANE")
    top, ref = lines[0], lines[1]
    match = LANE_REF.fullmatch(ref)
    if match is None:
        shown = ref.removeprefix("refs/heads/") if ref != "HEAD" else "a detached HEAD"
        raise NotInLane(f"{top} is on {shown}, not a Lane branch imm-lane/<slug>/<task>; cd into the Lane the "
                        "coordinator handed you, or pass --root LANE")
    return top, match.group(1)


def _in_lane(args: argparse.Namespace, action: Callable[[ReferenceKernel, str, str], int]) -> int:
    """Run `action(kernel, lane, task)` in the Lane of --root (default: here); refusals exit 2."""
    try:
        lane, task = locate_lane(getattr(args, "root", None) or ".")
        return action(ReferenceKernel(), lane, task)
    except (NotInLane, KernelError) as error:
        print(f"lanes-es task: {error}", file=sys.stderr)
        return EXIT_REFUSED


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return EXIT_REFUSED


# ---------------------------------------------------------------- output


def _show_status(status: TaskStatus, lane: str, as_json: bool, batch_child: dict[str, Any] | None = None) -> int:
    parked = batch_child is not None and batch_child.get("state") in PARKED_STATES
    if parked:  # the coordinator's word overrides the Lane's "done": nothing more happens without a person
        status = msgspec.structs.replace(status, next_step=(
            f"{batch_child['state']}: the coordinator parked this task ({batch_child.get('reason') or 'no reason'}); "
            f"this Lane is kept. A person decides: `lanes-es status {batch_child['initiative_slug']}` in the "
            f"coordinator checkout shows the batch"))
    if as_json:
        document = {"lane_path": lane, **msgspec.to_builtins(status)}
        if batch_child is not None:
            document["batch_child"] = batch_child
        print(json.dumps(document, indent=2, ensure_ascii=False))
        return EXIT_OK
    print(f"task {status.task_id} in Lane {lane} (run {status.run_id}, record revision {status.record_revision})")
    print(f"  lifecycle {status.lifecycle}, artifact {status.artifact_state}, "
          f"next obligation {status.next_obligation}, risk {status.risk}")
    if status.review.state != "none":
        print(f"  review: {status.review.state} ({status.review.operation_id})"
              + (f": {status.review.text}" if status.review.text else ""))
    if not status.holds_claim and status.lifecycle == "active":
        print("  warning: this Lane's claim is not held by the task; tell the coordinator")
    if status.findings:
        print("  latest QA findings:")
        for finding in status.findings:
            print(f"    {finding.id}: {finding.reason}")
    print(f"next: {status.next_step}")
    return EXIT_OK


def _show_verdict(verdict: Verdict, as_json: bool) -> int:
    if as_json:
        print(json.dumps(msgspec.to_builtins(verdict), indent=2, ensure_ascii=False))
    elif verdict.passed:
        print("every acceptance check passed; submit with `lanes-es task submit`")
    else:
        print("acceptance checks failed:")
        for finding in verdict.findings:
            print(f"  {finding.id}: {finding.reason}")
    return EXIT_OK if verdict.passed else EXIT_FINDING
