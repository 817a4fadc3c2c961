"""`lanes-es`: the command line of the lane batch engine.

Start-up is kept cheap (`lanes-es bench startup`): this module imports only argparse and the
exit codes; each command imports what it uses when it runs, and a command group that lives
in its own module (COMMAND_MODULES) is imported only when that command is the one asked for.
Every error reaches `run_guarded`, which keeps the exit-code table of lanes_es/exit_codes.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any, Callable, NoReturn

from lanes_es.exit_codes import EXIT_FINDING, EXIT_NEEDS_PERSON, EXIT_OK, EXIT_REFUSED, exit_code_text
from lanes_es.cli.errors import run_guarded

if TYPE_CHECKING:
    from lanes_es.usecases.deps import Deps

DESCRIPTION = """\
Run an Initiative's tasks in parallel git worktrees (Lanes) and integrate each onto the
batch branch imm/<slug> under guard. Every transition is an event in a per-batch log; the
state file .imm/state/batches/<batch_id>.json and its report are projections of that log.

A batch, step by step:
  lanes-es plan SLUG                       see the children, parallel groups and scope conflicts
  lanes-es authorize SLUG --max-parallel 2 confirm the plan (prints the batch id)
  lanes-es tick SLUG                       one tick: asks for Lanes (provision handoffs)
  git worktree add -b imm-lane/SLUG/TASK ../lane-TASK <base_head>
  lanes-es tick SLUG --offer TASK=/abs/path/lane-TASK
  (in the Lane) edit, then: lanes-es task submit
  lanes-es tick SLUG                       commits, integrates, completes
Or let the demo show it all: lanes-es demo
"""

EPILOG = "Exit codes (every command):\n" + exit_code_text()

# Commands whose code lives in a module of their own: imported only when asked for, so that
# `lanes-es --help`, `status` and `task submit` start fast. A module's `register(commands)`
# adds its commands; the help here is what `lanes-es --help` lists without importing it.
COMMAND_MODULES: dict[str, tuple[str, str]] = {
    "task": ("lanes_es.cli.task", "the Executor's commands inside a Lane: status, check, submit, review, stop"),
    "replay": ("lanes_es.cli.audit", "replay a batch's log, checking every step"),
    "verify": ("lanes_es.cli.audit", "verify a batch: chain, projections and, when completed, the batch branch"),
    "export": ("lanes_es.cli.audit", "write a batch's log as JSON Lines"),
    "audit": ("lanes_es.cli.audit", "write a batch's audit page (one self-contained HTML file)"),
    "key": ("lanes_es.cli.anchor", "the signing key of checkpoints and attestations"),
    "prove": ("lanes_es.cli.anchor", "print an inclusion proof of one event in the batch's signed checkpoint"),
    "verify-proof": ("lanes_es.cli.anchor", "check an inclusion proof against a checkpoint and a public key alone"),
    "initiative": ("lanes_es.cli.initiative", "write an Initiative and its tasks' intents (new, add-task)"),
    "intent": ("lanes_es.cli.intent", "read-only reports on TaskIntents: the scope overlap of intent files"),
    "batches": ("lanes_es.cli.batches", "list every batch in the store: repository, state, children by status"),
    "demo": ("lanes_es.cli.demo", "run a whole batch on a new temporary repository"),
    "bench": ("tools.bench", "benchmarks: git spawns and tick time, start-up, store, checkpoint, integration"),
    "run": ("lanes_es.cli.run", "the autopilot: run an Initiative's batch to the end"),
    "land": ("lanes_es.cli.land", "fast-forward your branch to a completed batch's branch"),
    "mcp": ("lanes_es.mcp_server", "serve the engine over MCP stdio (needs the mcp extra)"),
}
GLOBAL_OPTIONS_WITH_VALUE = ("--root", "--store")
DEFAULT_TICK_WAIT = 5.0  # usecases.lock.DEFAULT_LOCK_WAIT, not imported so that building the parser stays cheap
SLUG_HELP = "the Initiative: docs/initiatives/SLUG.md"
ROOT_HELP = ("your checkout of the repository (default: the current directory); a batch's coordinator worktree is "
             "found from its log")
STORE_HELP = ("event store URL: a SQLite path, sqlite:///PATH, postgresql://USER@HOST:PORT/DB or memory: "
              "(default: $LANES_ES_STORE, else <git common dir>/lanes-es/events.sqlite)")
MAX_COUNT = 2**53 - 1
BATCH_HELP = "the batch: its Initiative's slug, its batch id, or a unique prefix of the id"  # the largest count a record keeps (JavaScript's safe integer, as upstream)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(selected_command(argv))
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_REFUSED
    return run_guarded(lambda: args.func(args))


def selected_command(argv: list[str]) -> str | None:
    """The command word of an argument list (skipping the global options), or None."""
    skip = False
    for token in argv:
        if skip:
            skip = False
        elif token in GLOBAL_OPTIONS_WITH_VALUE:
            skip = True
        elif not token.startswith("-"):
            return token
    return None


def build_parser(selected: str | None = "*") -> argparse.ArgumentParser:
    """The parser; with `selected` a command word, only that command's module is imported ("*": every one)."""
    parser = ArgumentParser(prog="lanes-es", description=DESCRIPTION, epilog=EPILOG,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action=_VersionAction, help="print the installed version of lanes-es and exit")
    parser.add_argument("--root", default=".", help=ROOT_HELP)
    parser.add_argument("--store", default=None, help=STORE_HELP)
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")
    _add_plan(commands)
    _add_authorize(commands)
    _add_tick(commands)
    _add_status(commands)
    _add_flakes(commands)
    _add_rebuild(commands)
    _add_retire(commands)
    modules = dict.fromkeys(module for module, _ in COMMAND_MODULES.values())
    for module in modules:
        if selected == "*" or COMMAND_MODULES.get(selected or "", ("",))[0] == module:
            _register_optional(module, commands)
    for name, (module, help_text) in COMMAND_MODULES.items():
        if name not in commands.choices:
            placeholder = commands.add_parser(name, help=help_text, add_help=False)
            if selected == name:  # asked for, and its module is not installed: whatever follows, say why
                placeholder.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
                placeholder.set_defaults(func=lambda args, name=name: _not_installed(name))
    _with_conventions(parser, top=True)
    return parser


def _with_conventions(parser: argparse.ArgumentParser, top: bool = False) -> None:
    """What every command has, as git's do: its --help ends with the exit-code table (kept line for line), and
    the global options are taken after the command too (`lanes-es status SLUG --root DIR`)."""
    if parser.formatter_class is argparse.HelpFormatter:
        parser.formatter_class = HelpFormatter
    if EPILOG not in (parser.epilog or ""):
        parser.epilog = f"{parser.epilog}\n\n{EPILOG}" if parser.epilog else EPILOG
    if not top and not any("--root" in action.option_strings for action in parser._actions):
        shared = parser.add_argument_group("global options (also before the command)")
        shared.add_argument("--root", default=argparse.SUPPRESS, metavar="ROOT", help=ROOT_HELP)
        shared.add_argument("--store", default=argparse.SUPPRESS, metavar="STORE", help=STORE_HELP)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                if sub.add_help:  # a placeholder of a command whose module is missing has no help of its own
                    _with_conventions(sub)


class ArgumentParser(argparse.ArgumentParser):
    """argparse's, suggesting the closest command for a mistyped one (as git does)."""

    def error(self, message: str) -> NoReturn:
        import difflib
        import re

        mistyped = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)$", message)
        if mistyped:
            choices = re.findall(r"'([^']*)'", mistyped.group(2))
            close = difflib.get_close_matches(mistyped.group(1), choices, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            message = f"{message.split(' (choose from')[0]}{hint} (`{self.prog} --help` lists the commands)"
        super().error(message)


class HelpFormatter(argparse.HelpFormatter):
    """argparse's, except that an indented line (a table row, an example) is kept as written.

    Plain lines are wrapped to the terminal as argparse does; a line that starts with spaces, and
    each line starting a list item, starts a line of its own.
    """

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        import textwrap

        lines: list[str] = []
        prose: list[str] = []

        def flush() -> None:
            if prose:
                lines.append(textwrap.fill(" ".join(prose), width, initial_indent=indent, subsequent_indent=indent))
                prose.clear()

        for line in text.splitlines():
            if not line.strip() or line[:1].isspace() or line.startswith(("- ", "* ")):
                flush()
                if line.startswith(("- ", "* ")):
                    prose.append(line.strip())
                else:
                    lines.append(indent + line if line.strip() else "")
            else:
                prose.append(line.strip())
        flush()
        return "\n".join(lines)


class _VersionAction(argparse.Action):
    """`--version`, read from the installed distribution only when asked (importlib.metadata costs start-up)."""

    def __init__(self, option_strings: list[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            found = version("lanes-es")
        except PackageNotFoundError:  # run from a source tree that was never installed
            found = "unknown (not installed)"
        print(f"lanes-es {found}")  # on stdout, as git and pip print theirs
        parser.exit()


def _register_optional(module: str, commands: Any) -> None:
    """Command groups that live in their own modules register themselves when present."""
    import importlib

    try:
        loaded = importlib.import_module(module)
    except ModuleNotFoundError as error:
        if module.startswith(f"{error.name}.") or error.name == module:
            return
        raise
    loaded.register(commands)


def _not_installed(name: str) -> int:
    from lanes_es.errors import Refusal

    # The benchmarks (tools/) are the project's own tooling and stay out of the installed package.
    raise Refusal(f"source_checkout_needed: `lanes-es {name}` runs from a source checkout of lanes-es (its "
                  f"tools/ folder is not installed with the package); clone the repository, `pip install -e .` "
                  f"there, and run `lanes-es {name}` in it")


def deps_of(args: argparse.Namespace, read_only: bool = False) -> Deps:
    """The use cases' ports on the store of --store; `read_only` for a command that writes nothing (works on a
    read-only store)."""
    from lanes_es.bootstrap import bootstrap

    return bootstrap(args.root, args.store, read_only=read_only)


def _print(data: Any, as_json: bool, text: Callable[[Any], str]) -> None:
    print(json.dumps(data, indent=2, ensure_ascii=False) if as_json else text(data))


# ---------------------------------------------------------------- plan


def _add_plan(commands: Any) -> None:
    command = commands.add_parser("plan", help="show the batch plan of an Initiative (writes nothing)",
                                  description="Read docs/initiatives/SLUG.md and each task's docs/plans/<task>.intent.json "
                                              "and show the children, exclusions, parallel groups and scope conflicts.")
    command.add_argument("slug", metavar="SLUG", help=SLUG_HELP)
    command.add_argument("--json", action="store_true", help="print the plan as JSON")
    command.set_defaults(func=_plan)


def _plan(args: argparse.Namespace) -> int:
    from lanes_es.usecases.plan import plan as plan_of

    deps = deps_of(args, read_only=True)
    plan = plan_of(deps, args.slug)
    printable = {key: value for key, value in plan.items() if key != "enrollable"}
    printable["enrollable"] = [child.plain() for child in plan["enrollable"]]
    printable["unmatched_scope"] = _unmatched_scope(str(deps.root), plan["children"])
    _print(printable, args.json, _plan_text)
    return 0


def _unmatched_scope(root: str, children: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Per child, the scope entries that name no file of HEAD's tree (a typo, or a file the task creates)."""
    from pathlib import Path

    from lanes_es.adapters.batch_git import MAX_INTENT_BYTES
    from lanes_es.adapters.files import read_capped_text
    from lanes_es.cli.initiative import tree_paths
    from lanes_es.domain.authoring import ScopeIndex, unmatched_scope
    from lanes_es.domain.jstext import parse_json

    tree: ScopeIndex | None = None
    found: dict[str, list[str]] = {}
    for child in children:
        path = child.get("intent_path")
        try:
            scope = parse_json(read_capped_text(Path(root) / path, MAX_INTENT_BYTES))["scope_hint"] if path else None
        except (OSError, ValueError, KeyError, TypeError):
            continue  # the plan already says why such an intent is excluded (too large or deep ones included)
        if not isinstance(scope, list):
            continue
        tree = ScopeIndex(tree_paths(root)) if tree is None else tree
        missing = unmatched_scope([entry for entry in scope if isinstance(entry, str)], tree)
        if missing:
            found[child["task_id"]] = missing
    return found


def _plan_text(plan: dict[str, Any]) -> str:
    lines = [f"plan_digest {plan['plan_digest']}", "children:"]
    for child in plan["children"]:
        blocked = f" (blocked by {', '.join(child['blocked_by'])})" if child["blocked_by"] else ""
        reason = f": {child['reason']}" if child.get("reason") else ""
        lines.append(f"  {child['task_id']} [{child['status']}{reason}]{blocked}")
        if child["task_id"] in plan.get("intent_errors", {}):
            lines.append(f"    {plan['intent_errors'][child['task_id']]}")
    lines.append("parallel groups: " + " | ".join(", ".join(group) for group in plan["parallel_groups"]))
    for conflict in plan.get("scope_conflicts", []):
        lines.append(f"serialized: {conflict['task_id']} overlaps {', '.join(conflict['overlaps_with'])}")
    for task_id, entries in plan.get("unmatched_scope", {}).items():
        lines.append(f"warning: {task_id}'s scope {', '.join(entries)} matches no file of HEAD (fine for a file the "
                     f"task creates; check the spelling otherwise)")
    return "\n".join(lines)


# ---------------------------------------------------------------- authorize


def _add_authorize(commands: Any) -> None:
    command = commands.add_parser(
        "authorize", help="confirm a batch as the literal user (or resume a parked one)",
        description="Show the confirmation facts and record your answer. For an Initiative whose batch is parked "
                    "(needs_human) or still running, this is a fresh confirmation of that same batch; otherwise a "
                    "new batch id is minted from the current plan and HEAD.")
    command.add_argument("slug", metavar="SLUG", help=SLUG_HELP)
    command.add_argument("--max-parallel", type=positive_int, default=None, help="Lanes in flight at once (default 1)")
    command.add_argument("--max-children", type=positive_int, default=None,
                         help="children this authorization may start (default: every enrollable child)")
    command.add_argument("--qa-failure-limit", type=positive_int, default=None, help="QA failures per child before "
                         "the coordinator is asked for a correction (default 2)")
    command.add_argument("--final-verification", action="append", metavar="CMD", default=None,
                         help="a plain-argv command run on the batch branch before completion (1 to 8; repeatable)")
    command.add_argument("--delegate-revisions", action="store_true",
                         help="let the coordinator approve in-bounds breaking Intent revisions in a Lane (docs/upstream.md#delegated-intent-revisions)")
    add_integration_options(command)
    add_budget_options(command)
    add_coordinator_option(command)
    command.add_argument("--yes", action="store_true", help="confirm without asking (you are the literal user)")
    command.add_argument("--json", action="store_true", help="print the batch id and the confirmation facts as JSON")
    command.set_defaults(func=_authorize)


def add_coordinator_option(command: Any) -> None:
    command.add_argument("--coordinator", default=None, metavar="DIR",
                         help="where a new batch's coordinator runs: by default a worktree of its own under the git "
                              "common dir (lanes-es/coordinators/SLUG), so your checkout is never switched or "
                              "judged; DIR makes or reuses one there; `.` runs it in this checkout, as upstream "
                              "(LANES_ES_COORDINATOR sets the default). A recorded batch keeps its own")


def add_integration_options(command: Any) -> None:
    command.add_argument("--integration", choices=("serial", "speculative", "batched", "adaptive"), default=None,
                         help="how settled Lanes integrate: serial (upstream's, one candidate at a time), "
                              "speculative (cumulative candidates verified at once), batched (the top candidate "
                              "only, bisecting on a failure) or adaptive (batched or speculative, chosen each round "
                              "from how often this Initiative's Lanes failed lately; default)")
    command.add_argument("--verify-workers", type=positive_int, default=None,
                         help="candidate checks run at once (default: max_parallel)")
    command.add_argument("--flake-reruns", type=int, choices=range(0, 6), default=None, metavar="N",
                         help="flake policy: a check that failed on a candidate runs again up to N times (0 to 5; "
                              "default 0), only when it existed unchanged before the Lane; see `lanes-es flakes`")
    command.add_argument("--runner", default=None, metavar="RUNNER",
                         help="where candidate checks, Lane QA and Executor attempts run: local (this machine, the "
                              "default) or ray://HOST:PORT (a Ray cluster's client server; pip install "
                              "'lanes-es[ray]', RAY_AUTH_TOKEN set; docs/how-to/ray-cluster.md); default "
                              "$LANES_ES_RUNNER, else what the batch's last confirmation recorded")


BUDGET_HELP = {
    "attempts": "Executor attempts",
    "wall": "wall-clock time of the Executor attempts, added up: seconds (900) or 45m, 2h, 1h30m",
    "tokens": "tokens (in and out) the agents report",
    "usd": "dollars the agents report they cost (claude-code and opencode report it, codex does not)",
}


def add_budget_options(command: Any) -> None:
    """The Executor budgets a confirmation records (lanes_es/domain/executor_budget.py): per Lane, and for the
    Initiative (all its Lanes in the batch together). A new confirmation keeps those not given again."""
    from lanes_es.domain.executor_budget import INITIATIVE, LANE, MEASURES, PARSERS, option

    group = command.add_argument_group(
        "Executor budgets", "What a named agent's attempts may spend, recorded with the confirmation; a fresh "
        "confirmation keeps the budgets not given again. An attempt gets what is left as its limits (claude-code: "
        "--max-budget-usd) and is killed when it passes them; a task whose budget is spent is stopped and parks. "
        "A --executor CMD is bounded by attempts only. `none` clears a budget. See the how-to 'agent-executor'.")
    for scope in (LANE, INITIATIVE):
        for measure in MEASURES:
            name = option(scope, measure)
            key = name.removeprefix(f"--{scope}-budget-")
            whose = "each Lane's" if scope == LANE else "the Initiative's (all its Lanes together)"
            group.add_argument(name, type=_budget_type(PARSERS[measure]), default=None,
                               metavar="DURATION" if measure == "wall" else "USD" if measure == "cost" else "N",
                               dest=f"budget_{scope}_{measure}", help=f"{whose} budget of {BUDGET_HELP[key]}")


def _budget_type(parse: Any) -> Any:
    def convert(text: str) -> Any:
        from lanes_es.domain.executor_budget import InvalidBudget

        if text.strip().lower() == "none":
            return "none"  # clears a budget a confirmation recorded
        try:
            return parse(text)
        except InvalidBudget as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return convert


def budgets_given(args: argparse.Namespace) -> dict[tuple[str, str], float] | None:
    """The budget options given, (scope, measure) -> limit; None when none was."""
    from lanes_es.domain.executor_budget import INITIATIVE, LANE, MEASURES

    given = {(scope, measure): None if value == "none" else value for scope in (LANE, INITIATIVE)
             for measure in MEASURES if (value := getattr(args, f"budget_{scope}_{measure}", None)) is not None}
    return given or None


def positive_int(text: str) -> int:
    """An argparse type: a positive integer, or a clear usage error."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("expected a positive integer") from None
    if not 0 < value <= MAX_COUNT:
        raise argparse.ArgumentTypeError(f"expected a positive integer of at most {MAX_COUNT}")
    return value


def batch_options(args: argparse.Namespace) -> Any:
    """The confirmation options of `authorize` and `run` as one value (lanes_es/usecases/confirmation.py)."""
    import os

    from lanes_es.domain.inputs import parse_final_verification
    from lanes_es.usecases.confirmation import BatchOptions

    final = parse_final_verification(args.final_verification) if args.final_verification else None
    return BatchOptions(max_parallel=args.max_parallel, max_children=getattr(args, "max_children", None),
                        qa_failure_limit=getattr(args, "qa_failure_limit", None), final_verification=final,
                        delegate_revisions=args.delegate_revisions, integration=args.integration,
                        verify_workers=args.verify_workers, flake_reruns=args.flake_reruns,
                        executor_budget=budgets_given(args),
                        runner=args.runner or os.environ.get("LANES_ES_RUNNER") or None)


def _authorize(args: argparse.Namespace) -> int:
    from lanes_es.usecases.gate import QUESTION, ask_on_terminal, pass_gate

    def ask(confirmation: Any) -> Any:
        """The gate on this terminal: the facts as JSON, then the question (stdin a terminal), or --yes."""
        for task_id, text in confirmation.plan.get("intent_errors", {}).items():
            print(f"lanes-es: {task_id} is excluded: {text}", file=sys.stderr)
        if args.yes:
            return ask_on_terminal(QUESTION, True, None)
        print(json.dumps(confirmation.facts(), indent=2), file=sys.stdout if sys.stdin.isatty() else sys.stderr)
        return ask_on_terminal(QUESTION, False, input if sys.stdin.isatty() else None)

    from lanes_es.usecases.coordinator import confirming

    with confirming(deps_of(args), args.slug, args.coordinator) as deps:  # a refusal leaves no coordinator made
        confirmation, authorization = pass_gate(deps, args.slug, batch_options(args), ask)
    facts = confirmation.facts()
    if args.json:
        # the batch recorded: another coordinator's, when it confirmed the very same facts first
        print(json.dumps({**facts, "batch_id": authorization.batch_id, "coordinator": authorization.coordinator,
                          "confirmation_time": authorization.confirmation_time}, indent=2))
    else:
        print(authorization.batch_id)
    return 0


# ---------------------------------------------------------------- tick


def _add_tick(commands: Any) -> None:
    command = commands.add_parser(
        "tick", help="run one tick of the Initiative's batch",
        description="Observe every Lane, commit and integrate settled work, admit offered Lanes, and report the "
                    "handoffs: provision (make a Lane), executor (work in it), release (remove it), coordinator "
                    "(send a correction).", epilog=EPILOG)
    command.add_argument("slug", metavar="SLUG", help=SLUG_HELP)
    command.add_argument("--max-parallel", default=None, help="must repeat the authorized value when given")
    command.add_argument("--offer", action="append", default=[], metavar="TASK=PATH",
                         help="offer the Lane at PATH (relative to the current directory, or absolute) for TASK "
                              "(repeatable)")
    command.add_argument("--instruction", default=None, metavar="JSON",
                         help='a lane_instruction: {"task_id", "kind", "text", "session_state"}')
    command.add_argument("--revision", default=None, metavar="JSON",
                         help='a lane_revision: {"task_id", "next_intent": {...TaskIntent v1...}}')
    command.add_argument("--executor-runtime", default=None, metavar="DIR",
                         help="the runtime dir a Lane Executor loads, for the contract check on a new batch")
    command.add_argument("--wait", type=float, default=DEFAULT_TICK_WAIT, metavar="SECONDS",
                         help=f"when another tick holds the batch, wait this long for it (default {DEFAULT_TICK_WAIT:g}; "
                              f"0 refuses at once); then refuse as busy: exit 2, nothing written")
    command.add_argument("--json", action="store_true", help="print the whole report as JSON")
    command.set_defaults(func=_tick)


def parse_tick_inputs(max_parallel: Any, offers: Any, instruction: Any, revision: Any) -> dict[str, Any]:
    """Untrusted tick parameters, checked with upstream's limits before anything is read or written."""
    from lanes_es.domain.inputs import parse_lane_instruction, parse_lane_offers, parse_lane_revision, parse_max_parallel
    from lanes_es.tick_input import InstructionInput, LaneOfferInput, RevisionInput

    parsed_offers = parse_lane_offers(offers)
    parsed_instruction = parse_lane_instruction(instruction)
    parsed_revision = parse_lane_revision(revision)
    return {
        "max_parallel": parse_max_parallel(max_parallel),
        "offers": [LaneOfferInput(task_id=o.task_id, path=o.path) for o in parsed_offers or []],
        "instruction": None if parsed_instruction is None else InstructionInput(
            task_id=parsed_instruction.task_id, kind=parsed_instruction.kind, text=parsed_instruction.text,
            session_state=parsed_instruction.session_state),
        "revision": None if parsed_revision is None else RevisionInput(
            task_id=parsed_revision.task_id, next_intent=parsed_revision.next_intent),
    }


def _json_argument(text: str | None, name: str) -> Any:
    from lanes_es.domain.inputs import InvalidInput

    from lanes_es.domain.jstext import parse_json

    if text is None:
        return None
    try:
        return parse_json(text)
    except json.JSONDecodeError as error:
        raise InvalidInput(f"invalid {name}: not JSON ({error.msg})") from None
    except ValueError as error:  # nested too deeply, NaN or Infinity: JSON.parse refuses them too
        raise InvalidInput(f"invalid {name}: {error}") from None


def _tick(args: argparse.Namespace) -> int:
    from lanes_es.domain.inputs import InvalidInput

    max_parallel: Any = None
    if args.max_parallel is not None:
        try:
            max_parallel = int(args.max_parallel)
        except ValueError:
            max_parallel = args.max_parallel
    offers = []
    for item in args.offer:
        task_id, sep, path = item.partition("=")
        if not sep:
            raise InvalidInput(f"invalid lane_offers: expected TASK=PATH, got {item!r}")
        import os

        # a path typed on the command line is the user's, from where they are (upstream's tool takes absolute ones)
        offers.append({"task_id": task_id, "path": os.path.abspath(path) if path else path})
    inputs = parse_tick_inputs(max_parallel, offers or None, _json_argument(args.instruction, "lane_instruction"),
                               _json_argument(args.revision, "lane_revision"))
    from lanes_es.usecases.lock import BatchBusy
    from lanes_es.usecases.tick import tick

    try:
        result = tick(deps_of(args), args.slug, executor_runtime=args.executor_runtime, wait=args.wait, **inputs)
    except BatchBusy as busy:
        if not args.json:
            raise
        print(json.dumps(busy.report(), indent=2))
        return EXIT_REFUSED
    for line in result.drift:
        print(f"lanes-es: drift repaired: {line}", file=sys.stderr)
    if result.anchor_problem:
        print(f"lanes-es: checkpoint not written: {result.anchor_problem}", file=sys.stderr)
    if result.report["batch_state"] == "rejected":  # a refusal: its one line on stderr, the report only as data
        if args.json:
            _print(result.report, True, report_text)
        print(f"lanes-es: {rejection_text(result.report)}", file=sys.stderr)
        return result.exit_code
    _print(result.report, args.json, report_text)
    if result.exit_code == EXIT_OK and result.report.get("lane_refusals"):
        return EXIT_REFUSED  # an offer was refused: only its audit event was written; the lines above say why
    from lanes_es.domain.next_steps import needs_a_person

    if result.exit_code == EXIT_OK and needs_a_person(result.report):
        return EXIT_NEEDS_PERSON  # completed, but its final verification failed: not fit to land
    return result.exit_code


def rejection_text(report: dict[str, Any]) -> str:
    """A rejected tick in CLI words: what was refused and why, what it recorded, and the commands to run next (the
    report's next_action names upstream's MCP tool)."""
    from lanes_es.domain.next_steps import command_line_next

    releases = [handoff["task_id"] for handoff in report.get("handoffs", [])
                if handoff["role"] == "lane-steward" and handoff.get("action") == "release"]
    released = (f"; the Lanes of {', '.join(releases)} may be removed (integrated, clean)" if releases else "")
    return (f"tick refused: {report['reason']}; nothing was changed (a started batch's log records the refusal)"
            f"{released}; next: {command_line_next(report)}")


def report_text(report: dict[str, Any]) -> str:
    """A readable summary of a report: state, reason, children, handoffs, next action."""
    lines = [f"batch {report['batch_id']}: {report['batch_state']}"]
    if report.get("reason"):
        lines.append(f"reason: {report['reason']}")
    for child in report["children"]:
        detail = f" ({child['reason']})" if child.get("reason") else ""
        commit = f" {child['commit'][:12]}" if child.get("commit") else ""
        lines.append(f"  {child['task_id']:<24} {child['state']}{commit}{detail}")
    for handoff in report.get("handoffs", []):
        lines.append("handoff: " + _handoff_text(handoff))
    for refusal in report.get("lane_refusals", []):
        hint = _refusal_hint(refusal)
        lines.append(f"refused offer: {refusal['task_id']} at {refusal['path']}: {refusal['reason']}"
                     + (f" ({hint})" if hint else ""))
    for key in ("lane_instruction", "lane_revision"):
        if key in report:
            lines.append(f"{key}: {json.dumps(report[key])}")
    final = report.get("final_verification")
    if isinstance(final, dict):  # a report's: the run's result
        lines.append(f"final verification: {'passed' if final['passed'] else 'FAILED'} at {final['head'][:12]}")
    elif final:  # a record's: the commands confirmed, run once every child is integrated
        lines.append(f"final verification: {'; '.join(final)} (runs once every child is integrated)")
    from lanes_es.domain.next_steps import command_line_next

    lines.append(f"next: {command_line_next(report)}")  # the report's own next_action names upstream's MCP tool
    return "\n".join(lines)


def _refusal_hint(refusal: dict[str, Any]) -> str:
    import os

    from lanes_es.domain.next_steps import offer_refusal_hint

    if not os.path.isdir(refusal["path"]):
        return (f"{refusal['path']} is not a directory: make the Lane first with the provision handoff's "
                f"`git worktree add`, then offer it")
    return offer_refusal_hint(refusal["reason"], refusal["path"])


def _handoff_text(handoff: dict[str, Any]) -> str:
    role, task = handoff["role"], handoff["task_id"]
    if role == "lane-steward" and handoff["action"] == "provision":
        return f"provision a Lane for {task}: git worktree add -b {handoff['lane_branch']} <dir> {handoff['base_head']}"
    if role == "lane-steward":
        return f"release the Lane of {task} (branch {handoff['lane_branch']}) once it is clean"
    if role == "coordinator":
        return f"send {task} a correction ({handoff['corrections_left']} left) in {handoff['lane_path']}"
    return f"run the Executor of {task} in {handoff['lane_path']} (next: {handoff['next_obligation']})"


# ---------------------------------------------------------------- status, rebuild, retire


def _add_status(commands: Any) -> None:
    command = commands.add_parser("status", help="show a batch's current record",
                                  description="The current v2 record of the Initiative's active batch, or of --batch ID.")
    command.add_argument("slug", metavar="SLUG", nargs="?", help=SLUG_HELP + " (or --batch)")
    command.add_argument("--batch", default=None, metavar="BATCH",
                         help=BATCH_HELP + " (default: the Initiative's current batch)")
    command.add_argument("--json", action="store_true", help="print the record as JSON")
    command.set_defaults(func=_status)


def _status(args: argparse.Namespace) -> int:
    from lanes_es.usecases.status import status

    deps = deps_of(args, read_only=True)
    batch_id = None
    if args.batch:
        from lanes_es.cli.batch_ref import resolve_batch_id

        batch_id = resolve_batch_id(deps.store, args.batch)
    found = status(deps, args.slug, batch_id)
    batch = found.batch
    if batch is None:  # authorized but not ticked yet: the batch id exists, its record not yet
        where = coordinator_text(deps, found.not_started["batch_id"])
        _print(found.not_started, args.json, lambda f: "\n".join([
            f"batch {f['batch_id']}: authorized, not started yet ({len(f['children'])} children, max_parallel "
            f"{f['max_parallel']})", *where, f"next: {f['next_action']}"]))
        return EXIT_OK
    from lanes_es.projections.attempts import attempts_json, attempts_lines, budget_json, budget_lines

    record = batch.record
    runs = batch.executor_runs
    task_ids = [child["task_id"] for child in record["children"]]
    report = batch.report if batch.report and batch.report.get("batch_state") == record["batch_state"] else None
    # the written report, when it is the record's state: it says why the batch stopped and the final verification's
    # result; otherwise the record (a running batch)
    text = report or {**record, "reason": None, "handoffs": []}
    shown = {**record, "executor_attempts": attempts_json(runs)} if runs.attempts and args.json else record
    if args.json and (found.executor_budget is not None or runs.exhausted):
        shown = {**shown, "executor_budget": budget_json(runs, found.executor_budget, task_ids)}
    where = coordinator_text(deps, batch.id)
    _print(shown, args.json, lambda r: "\n".join([report_text(text), integration_text(batch), *attempts_lines(runs),
                                                  *budget_lines(runs, found.executor_budget, task_ids),
                                                  *where])
           + failures_text(batch))
    return EXIT_OK


def coordinator_text(deps: Any, batch_id: str) -> list[str]:
    """Where the batch's coordinator worktree is (nothing for a batch run in place): lanes-es's own fact."""
    from pathlib import Path

    from lanes_es.usecases.coordinator import authorization_of

    authorization = authorization_of(deps.store, batch_id)
    path = authorization.coordinator if authorization is not None else None
    if path is None:
        return []
    if not (Path(path) / ".git").exists():
        return [f"coordinator: {path} (removed; the batch's files were written to your checkout when it landed)"]
    return [f"coordinator: worktree {path} on {authorization.branch} (your checkout is not touched; "
            f"`git -C {path} log` shows the batch's commits)"]


def failures_text(batch: Any) -> str:
    """Why each parked child, or child back in rework, stopped: its failed checks' reasons, times and output
    tails, and where a failed candidate is kept (from the log; the v2 record has no place for them)."""
    from lanes_es.projections.failures import failure_lines
    from lanes_es.projections.timeline import facts_of

    lines: list[str] = []
    for child in batch.record["children"]:
        event = batch.failures.get(child["task_id"])
        if event is None or child["state"] not in ("needs_human", "enrolled"):
            continue
        shown = failure_lines(facts_of(event))
        if shown:
            lines.append(f"why {child['task_id']} stopped ({type(event).__name__} at {event.at}):")
            lines += [f"  {line}" for line in shown]
    return "".join(f"\n{line}" for line in lines)


def integration_text(batch: Any) -> str:
    """How the batch integrates: lanes-es's own fact, from the log (the v2 record has no place for it)."""
    workers = f", {batch.verify_workers} verify workers" if batch.verify_workers else ""
    reruns = f", flake reruns {batch.flake_reruns}" if batch.flake_reruns else ""
    return f"integration: {batch.integration}{workers}{reruns}"


def _add_flakes(commands: Any) -> None:
    command = commands.add_parser("flakes", help="checks that passed only on a rerun, across batches",
                                  description="Every check that failed on an integration candidate and then passed "
                                              "when the flake policy (authorize --flake-reruns N) ran it again, "
                                              "with how often and in how many batches, most frequent first.")
    command.add_argument("--json", action="store_true", help="print the checks as JSON")
    command.set_defaults(func=_flakes)


def _flakes(args: argparse.Namespace) -> int:
    from lanes_es.projections.flakes import flaky_checks

    store = deps_of(args, read_only=True).store
    rows = flaky_checks((batch_id, store.verified_events(batch_id)) for batch_id in store.batch_ids())
    _print(rows, args.json, lambda found: "\n".join(
        f"{row['check']}: passed on a rerun {row['passed_on_rerun']} time(s) in {len(row['batches'])} batch(es), "
        f"last {row['batches'][-1]}" for row in found) or "no check passed only on a rerun")
    return 0


def _add_rebuild(commands: Any) -> None:
    command = commands.add_parser(
        "rebuild", help="rewrite the state file and report from the log (or check them)",
        description="Recompute every projection of a batch from its event log. With --check nothing is written and "
                    "the exit code is 1 on any byte of drift.")
    command.add_argument("batch_id", metavar="BATCH", nargs="?", help=BATCH_HELP)
    command.add_argument("--all", action="store_true", help="every batch this checkout coordinates (a shared "
                         "store's other batches are left to their checkouts), and the read model of `lanes-es batches` "
                         "(a progress bar on a terminal); exit 1 when anything had drifted")
    command.add_argument("--check", action="store_true", help="write nothing; exit 1 on drift")
    command.add_argument("--from-export", default=None, metavar="FILE", help="rebuild from an exported log")
    command.set_defaults(func=_rebuild)


def _rebuild(args: argparse.Namespace) -> int:
    from lanes_es.errors import ServiceError
    from lanes_es.usecases.rebuild import rebuild

    if args.from_export:
        from lanes_es.audit.export import ExportError, rebuild_from_export
        from lanes_es.bootstrap import locate_repository

        try:
            written = rebuild_from_export(args.from_export, locate_repository(args.root).root)
        except ExportError as error:
            raise ServiceError("invalid_export", str(error)) from None
        for path in written:
            print(f"wrote {path}")
        return 0
    deps = deps_of(args, read_only=args.check)
    if args.all:
        from lanes_es.cli.batches import rebuild_all

        return rebuild_all(deps, check=args.check)
    if args.batch_id:
        from lanes_es.cli.batch_ref import resolve_batch_id

        batch_ids = [resolve_batch_id(deps.store, args.batch_id)]
    else:
        raise ServiceError("invalid_input", "name a BATCH (its Initiative's slug or its id) or pass --all")
    from lanes_es.usecases.coordinator import batch_root

    results = {}
    for batch_id in batch_ids:
        results.update(rebuild(deps.store, batch_root(deps.store, deps.root, batch_id), [batch_id], check=args.check))
    drifted = False
    for batch_id, items in results.items():
        if args.check:
            drifted = drifted or bool(items)
            print(f"{batch_id}: " + ("; ".join(items) if items else "no drift"))
        else:
            print(f"{batch_id}: " + (f"rewrote {', '.join(items)}" if items else "already matches the log"))
    return EXIT_FINDING if drifted else EXIT_OK


def _add_retire(commands: Any) -> None:
    command = commands.add_parser("retire", help="retire the Initiative's stale batch (superseded)",
                                  description="upstream's retire_stale_batch: the active batch becomes superseded. "
                                              "Refused while a child is in flight.")
    command.add_argument("slug", metavar="SLUG", help=SLUG_HELP)
    command.add_argument("--yes", action="store_true", help="confirm without asking")
    command.add_argument("--json", action="store_true", help="print the superseded record's summary as JSON")
    command.set_defaults(func=_retire)


def _retire(args: argparse.Namespace) -> int:
    from lanes_es.usecases.coordinator import coordinator_of
    from lanes_es.usecases.gate import ask_on_terminal, require_confirmed
    from lanes_es.usecases.retire import retire_and_remove_coordinator, retire_target

    deps = deps_of(args)
    # refusals before the gate; the record's bytes for the CAS
    target = retire_target(coordinator_of(deps, args.slug), args.slug)
    answer = ask_on_terminal(f"Retire batch {target.batch_id} of {args.slug}? [y/N] ", args.yes,
                             input if sys.stdin.isatty() else None, "no terminal to ask on; run again with --yes")
    require_confirmed(answer, "nothing was retired")
    report, left = retire_and_remove_coordinator(deps, args.slug, target)
    _print(report, args.json, lambda retired: _retired_text(args.slug, retired, left))
    return 0


def _retired_text(slug: str, report: dict[str, Any], coordinator: str = "") -> str:
    """The retirement, and the Lanes and branch it leaves, which the next batch of the Initiative must not meet
    (a batch never ticked has no record: only its id)."""
    lines = [f"batch {report['batch_id']}: superseded", report.get("reason") or ""]
    for child in report.get("children", []):
        lane = child.get("lane")
        if lane and child["state"] != "released":
            lines.append(f"kept the Lane of {child['task_id']}: {lane['path']} (keep what you need from it, then "
                         f"`git worktree remove --force {lane['path']}` and `git branch -D {lane['branch']}`)")
    if report.get("commits"):
        lines.append(f"imm/{slug} holds its {len(report['commits'])} integrated commit(s): land them, or go on from "
                     f"them with `git switch imm/{slug}`")
    if coordinator:
        lines.append(coordinator)
    lines.append(f"next: `lanes-es run {slug} ...` (or `lanes-es authorize {slug}`) starts a new batch")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
