"""`lanes-es run`: the command line of the autopilot; the autopilot itself is `lanes_es.steward`."""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any, Callable

RUN_DESCRIPTION = """\
The autopilot: run an Initiative's batch to the end, playing Parent and Lane Steward.

  lanes-es run SLUG --max-parallel 3 --lanes-dir ../lanes --executor "my-agent --task-from-env"

It confirms the batch first when it has no valid authorization (the facts are shown; you are
asked, or --yes answers for you), then ticks, makes a Lane (git worktree add -b
imm-lane/SLUG/TASK DIR/TASK BASE) for each provision handoff, offers it, and starts the
Executor command in each Lane. The Executor gets its task in its environment:

  LANES_ES_TASK_ID    the task id
  LANES_ES_LANE_PATH  the Lane (also its working directory)
  LANES_ES_INTENT     the task's TaskIntent JSON text
  LANES_ES_ROOT       the coordinator checkout
  LANES_ES_NEXT_OBLIGATION  what the task needs next (submit_assurance, run_review, ...)

and says it is done with `lanes-es task submit` in the Lane, as a person would. Its output
goes to DIR/.executor-logs/TASK.log. When an Executor exits the autopilot ticks again; a
Lane is removed (git worktree remove, never forced) only on a release handoff and only when
it is clean: a dirty Lane is kept and reported.

It stops on completed, needs_human, budget_stopped, failed, a rejected tick or a
coordinator handoff, and when nothing more can happen without you; the summary says what to
do next. Interrupted or killed, run the same command again: it goes on from the log.

Try it on the demo's Initiative, with the demo's scripted Executor (lanes_es.cli.example_executor: it
writes what its hints name, so elsewhere its work fails the task's checks):

  DIR=$(mktemp -d)
  lanes-es demo --dir "$DIR" --no-run
  lanes-es --root "$DIR/repo" run demo --max-parallel 3 --lanes-dir "$DIR/lanes" --yes \\
    --executor "{python} -P -m lanes_es.cli.example_executor --hints $DIR/executor-hints.json"

With your own Executor:
  lanes-es --root REPO run SLUG --max-parallel 3 --lanes-dir ../lanes --executor "my-agent --task-from-env"
"""

RUN_EPILOG = ("It exits 0 when the batch completed, 3 when it stopped for a person (needs_human,\n"
              "budget_stopped, failed, a coordinator handoff, a failed final verification, no progress).")


# ---------------------------------------------------------------- command line


def register(commands: Any) -> None:
    from lanes_es.cli.main import positive_int

    command = commands.add_parser("run", help="the autopilot: run an Initiative's batch to the end",
                                  description=RUN_DESCRIPTION.format(python=sys.executable), epilog=RUN_EPILOG,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    command.add_argument("slug", metavar="SLUG", help="the Initiative (docs/initiatives/SLUG.md)")
    command.add_argument("--max-parallel", type=positive_int, required=True, metavar="N", help="Lanes in flight at once")
    command.add_argument("--lanes-dir", required=True, metavar="DIR",
                         help="where Lanes are made, one per task as DIR/TASK (outside the coordinator checkout)")
    command.add_argument("--executor", required=True, metavar="NAME|CMD",
                         help="a coding agent by name: claude-code, codex or opencode (each attempt runs it headless in "
                              "the Lane and submits its work); or the Executor command, split into argv like a shell "
                              "would but run without one")
    command.add_argument("--executor-timeout", type=positive_int, default=3600, metavar="SECONDS",
                         help="a named agent's attempt is killed (its whole process group) after SECONDS of wall "
                              "clock (default 3600)")
    command.add_argument("--yes", action="store_true", help="confirm the batch without asking (you are the literal user)")
    command.add_argument("--final-verification", action="append", metavar="CMD", default=None,
                         help="with a new confirmation: a plain-argv command run on the batch branch before the "
                              "batch completes (1 to 8; repeatable)")
    command.add_argument("--delegate-revisions", action="store_true",
                         help="with a new confirmation: let the coordinator approve in-bounds breaking Intent "
                              "revisions in a Lane (docs/upstream.md#delegated-intent-revisions)")
    command.add_argument("--json", action="store_true",
                         help="one JSON object per line for every event of the batch's log and every move of the "
                              "steward, then the summary (kind: event, steward, note, summary)")
    command.add_argument("--wait", type=_seconds_up_to(86400, zero=True), default=0.0, metavar="SECONDS",
                         help="when another autopilot runs this Initiative, wait up to SECONDS for it to end "
                              "(default: refuse at once, naming it)")
    from lanes_es.cli.main import add_budget_options, add_integration_options

    add_integration_options(command)  # with a new confirmation
    add_budget_options(command)
    from lanes_es.cli.main import add_coordinator_option

    add_coordinator_option(command)
    command.add_argument("--poll", type=_seconds_up_to(60), default=1.0, metavar="SECONDS",
                         help="how often to look at the running Executors (default 1)")
    command.set_defaults(func=_run)


def _seconds_up_to(most: float, zero: bool = False) -> Callable[[str], float]:
    """An argparse type: a number of seconds, more than 0 (or 0 itself when `zero`) and at most `most`."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError("expected a number of seconds") from None
        if not (0 <= value if zero else 0 < value) or value > most:
            raise argparse.ArgumentTypeError(f"expected {'0' if zero else 'more than 0'} to {most:g} seconds")
        return value

    return parse


def _run(args: argparse.Namespace) -> int:
    from lanes_es.errors import ServiceError
    from lanes_es.steward.run import AutopilotOptions, run_autopilot, runs_on_cluster
    from lanes_es.cli.main import batch_options, deps_of

    try:
        argv = shlex.split(args.executor)
    except ValueError as error:
        raise ServiceError("invalid_executor", f"the Executor command cannot be split: {error}") from None
    if argv and "/" in argv[0]:  # a program named by a path: from here, as a shell would, not from each Lane
        argv[0] = os.path.abspath(argv[0])
    lanes_dir = os.path.abspath(args.lanes_dir)
    options = batch_options(args)
    deps = deps_of(args)
    refuse_unusable_run(argv, Path(lanes_dir), runs_on_cluster(deps, args.slug, options))
    refuse_unbounded(argv, options.executor_budget)
    options = AutopilotOptions(batch=options, lanes_dir=lanes_dir, executor=argv, yes=args.yes,
                               poll=args.poll, wait=args.wait, json_lines=args.json,
                               attempt_seconds=args.executor_timeout, coordinator=args.coordinator)
    return run_autopilot(deps, args.slug, options)


def _refuse_unusable_command(program: str) -> None:
    """An --executor command this machine cannot start: not on PATH, no such file, or not executable."""
    from lanes_es.errors import ServiceError

    if "/" not in program and shutil.which(program) is None:
        raise ServiceError("invalid_executor", f"the Executor command {program!r} is not on PATH; install it, or "
                                               f"give its absolute path with --executor")
    if program.startswith("/") and not os.path.isfile(program):
        raise ServiceError("invalid_executor", f"the Executor command {program} does not exist; check the path "
                                               f"given with --executor")
    if program.startswith("/") and not os.access(program, os.X_OK):
        raise ServiceError("invalid_executor", f"the Executor command {program} is not executable; make it so "
                                               f"(chmod +x {shlex.quote(program)}), or name its interpreter first "
                                               f"(--executor 'sh {program}')")


def refuse_unusable_run(argv: list[str], lanes_dir: Path, on_nodes: bool = False) -> None:
    """What would only fail after the batch is confirmed and Lanes are made is refused before anything is written.
    `on_nodes`: a named agent runs on a Ray cluster's nodes, and its program is theirs, not this machine's."""
    from lanes_es.errors import ServiceError

    if not argv:
        raise ServiceError("invalid_executor", "--executor is empty; name the command each Lane's Executor runs")
    from lanes_es.executors import agent_named
    from lanes_es.steward.run import agent_program

    agent = agent_named(argv[0]) if len(argv) == 1 else None
    if agent is None:
        _refuse_unusable_command(argv[0])
    elif not on_nodes:  # on a Ray cluster the agent's program is the nodes', not this machine's
        agent_program(agent)
    if lanes_dir.exists() and not lanes_dir.is_dir():
        raise ServiceError("invalid_lanes_dir", f"--lanes-dir {lanes_dir} is a file; name a directory (it is made "
                                                f"when missing)")
    existing = lanes_dir.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        what = "" if existing == lanes_dir.absolute() else f" (its nearest existing part {existing})"
        raise ServiceError("invalid_lanes_dir", f"--lanes-dir {lanes_dir}{what} "
                                                f"{'cannot be written by this user' if existing.is_dir() else 'is a file'}"
                                                f", so no Lane can be made there; name a directory you can write, "
                                                f"or fix its owner or mode (chmod u+w {existing})")
    _probe_lanes_dir(lanes_dir.absolute(), existing)


def refuse_unbounded(argv: list[str], given: dict[tuple[str, str], float] | None) -> None:
    """A budget the Executor cannot be held to is refused before anything is confirmed."""
    if not given:
        return
    from lanes_es.domain.executor_budget import with_values
    from lanes_es.executors import agent_named
    from lanes_es.steward.run import refuse_unbounded_budgets

    agent = agent_named(argv[0]) if len(argv) == 1 else None
    refuse_unbounded_budgets(with_values(None, given), agent)


def _probe_lanes_dir(lanes_dir: Path, existing: Path) -> None:
    """Make the directory and a file in it, as the steward will, and take them away again: a place the mode bits
    allow but the file system refuses (/proc, a read-only mount, a full disk) is refused before any confirmation."""
    import tempfile

    from lanes_es.errors import ServiceError

    made = [parent for parent in [lanes_dir, *lanes_dir.parents] if parent not in (existing, *existing.parents)]
    try:
        lanes_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=lanes_dir):
            pass
    except OSError as error:
        raise ServiceError("invalid_lanes_dir", f"--lanes-dir {lanes_dir} cannot hold Lanes: "
                                                f"{error.strerror or error}; name a directory on a writable disk"
                                                ) from None
    finally:
        for parent in made:  # what the probe made, deepest first; the steward makes it again when it needs it
            try:
                parent.rmdir()
            except OSError:
                break


__all__ = ["register", "refuse_unusable_run"]
