"""`run_autopilot`: the autopilot for one Initiative's batch, from the confirmation to the summary."""

from __future__ import annotations

import os
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from lanes_es.adapters.steward_lease import LeaseHolder, StewardLeases
from lanes_es.adapters.processes import reap_abandoned_once
from lanes_es.errors import ServiceError
from lanes_es.exit_codes import EXIT_OK, EXIT_REFUSED
from lanes_es.steward.attempts import AttemptLog, Record
from lanes_es.steward.executors import DEFAULT_ATTEMPT_SECONDS, EXECUTOR_LOGS, Executors, ExecutorUnavailable
from lanes_es.steward.lanes import Steward
from lanes_es.steward.lease import LeaseLost, StewardBusy, StewardLease
from lanes_es.steward.loop import Autopilot
from lanes_es.steward.feed import BatchFeed
from lanes_es.steward.progress import Guarded, JsonProgress, LineProgress, Out, Progress, note_item, steward_item
from lanes_es.usecases.confirmation import BatchOptions
from lanes_es.usecases.coordinator import confirming
from lanes_es.usecases.deps import Deps
from lanes_es.usecases.gate import QUESTION, ask_on_terminal, authorization_needed, confirmation_text, pass_gate
from lanes_es.usecases.load import active_batch, current_authorization


@dataclass(frozen=True)
class AutopilotOptions:
    """What `lanes-es run` is asked: the batch's confirmation options, where Lanes go, the Executor, and how
    the run waits, asks and tells.

    `batch.max_parallel` is required. `yes` confirms without asking. `poll` is how often running
    Executors are looked at; `wait` how long to wait for another autopilot of the Initiative (its
    steward lease, in the store) before refusing. `json_lines` makes every line a JSON object; `live`
    draws a live board on the terminal (None: when `out` is `print` and stdout is a terminal).
    `executor_env` is added to every Executor's environment (the demo passes LANES_ES_EXECUTOR_HINT).
    An `executor` of one adapter name (claude-code, codex, opencode) runs that agent, each of its
    attempts ended after `attempt_seconds`. `coordinator` is where a new batch's coordinator goes
    (lanes_es/usecases/coordinator.py: None its own worktree, `.` in place, or a directory).
    """

    batch: BatchOptions
    lanes_dir: str | os.PathLike[str]
    executor: list[str]
    yes: bool = False
    poll: float = 1.0
    wait: float = 0.0
    json_lines: bool = False
    live: bool | None = None
    executor_env: Mapping[str, str] | None = None
    attempt_seconds: int = DEFAULT_ATTEMPT_SECONDS
    coordinator: str | None = None


def run_autopilot(deps: Deps, slug: str, options: AutopilotOptions, out: Out = print, *,
                  ask: Callable[[str], str] | None = None, leases: StewardLeases | None = None) -> int:
    """Run the Initiative's batch to the end; the exit code of `lanes-es run`.

    `out` receives every line. `ask` puts the confirmation question (default: `input` when stdin
    is a terminal; with neither, only `options.yes` can confirm). `leases` defaults to the store's own.
    """
    if not options.executor:
        raise ServiceError("invalid_executor", "the Executor command is empty; pass --executor CMD")
    reap_abandoned_once()  # the checks and trees an autopilot killed before this one left behind
    max_parallel = options.batch.max_parallel
    if max_parallel is None:
        raise ServiceError("invalid_input", "the autopilot needs max_parallel; pass --max-parallel N")
    lanes = Path(options.lanes_dir).resolve()
    root = Path(deps.root).resolve()
    if lanes == root or root in lanes.parents:
        raise ServiceError("invalid_lanes_dir", f"{lanes} is inside the coordinator checkout {root}; Lanes there make "
                                                f"it dirty: choose a directory outside it, for example {root.parent / 'lanes'}")
    json_lines = options.json_lines
    live = options.live
    if live is None:
        live = out is print and sys.stdout.isatty() and not json_lines
    if ask is None and sys.stdin.isatty():
        ask = input if not json_lines else ask_on_stderr
    progress = Guarded(choose_progress(out, live, json_lines))

    def note(line: str) -> None:
        progress.tell(note_item(line))

    def refuse(code: str, text: str, **facts: Any) -> None:
        if out is print and not json_lines:  # a person's terminal: on stderr, as every other command's refusal
            print(text, file=sys.stderr)
            return
        progress.tell(steward_item("refused", text, reason=code, **facts))

    def waiting_for(holder: LeaseHolder) -> None:
        progress.tell(steward_item("lease_waited", f"waiting up to {options.wait:g}s for the autopilot that holds "
                                   f"Initiative {slug}: {holder.describe()}", **holder_facts(holder)))

    lease = StewardLease(leases or StewardLeases(deps.store.url), slug)
    autopilot: Autopilot | None = None
    # The lease is a row in the store: on a store not made yet it is taken once the confirmation's append made
    # it, so that a refused confirmation writes nothing (two first runs at once are told apart by the lease then).
    new_store = not deps.store.made
    stack = ExitStack()
    try:
        if not new_store:
            lease.take(options.wait, waiting_for)
        deps = stack.enter_context(confirming(deps, slug, options.coordinator))  # under the lease: one makes it
        on_nodes = runs_on_cluster(deps, slug, options.batch)
        refuse_cluster_without_token(on_nodes)
        executors = executors_for(options.executor, deps.root, lanes / EXECUTOR_LOGS, options.executor_env,
                                  options.attempt_seconds, on_nodes)
        autopilot = Autopilot(deps=deps, slug=slug, max_parallel=max_parallel, steward=Steward(deps.root, lanes),
                              executors=executors, progress=progress, poll=options.poll,
                              feed=BatchFeed(deps.store), lease=lease,
                              attempts=AttemptLog(executors, attempt_recorder(deps), deps.store.batch,
                                                  attempts_anchor(deps)))
        confirm_batch(deps, slug, options, note, ask)
        on_cluster(deps, slug, executors)
        refuse_unbounded_budgets(recorded_budgets(deps, slug), executors.agent)
        if new_store:
            lease.take(options.wait, waiting_for)
        stack.pop_all()  # confirmed: the coordinator stays, whatever happens next
        return autopilot.run()
    except ExecutorUnavailable as error:
        refuse("executor_unavailable", f"lanes-es run: {error}")
        _wait_for_all(autopilot)
        return EXIT_REFUSED
    except StewardBusy as error:
        refuse(error.code, f"lanes-es run: {error.detail}", **holder_facts(error.holder))
        return EXIT_REFUSED
    except LeaseLost as error:  # the autopilot that took over adopts the Executors by their pid files
        refuse(error.code, f"lanes-es run: {error.detail}")
        return EXIT_REFUSED
    except ServiceError as error:
        _wait_for_all(autopilot)
        if error.code == "empty_enrollable_set":
            return nothing_to_run(deps, slug, note, lambda text: refuse(error.code, text))
        refuse(error.code, f"lanes-es run: {error}")
        return EXIT_REFUSED
    except KeyboardInterrupt:
        progress.close()
        running = autopilot.executors.running if autopilot is not None else {}
        progress.tell(steward_item("interrupted", interrupted_text(running), task_ids=sorted(running)))
        return 130
    finally:
        stack.close()  # a refusal before the confirmation was recorded removes the coordinator it made
        lease.give_back()
        progress.close()


def _wait_for_all(autopilot: Autopilot | None) -> None:
    if autopilot is not None:
        autopilot.wait_for_all()


def confirm_batch(deps: Deps, slug: str, options: AutopilotOptions, out: Out,
                  ask: Callable[[str], str] | None) -> None:
    """The gate, when no authorization lets the batch run now: the facts told, the question put (or --yes)."""
    if not authorization_needed(deps, slug) and not changes_budgets(deps, slug, options.batch):
        return

    def ask_here(confirmation: Any) -> Any:
        out(confirmation_text(confirmation.facts(), with_delegation=options.batch.delegate_revisions))
        return ask_on_terminal(QUESTION, options.yes, ask)

    confirmation, authorization = pass_gate(deps, slug, options.batch, ask_here)
    # the batch recorded: another command's, when it confirmed the very same facts first (as `authorize` says)
    out(f"confirmed {authorization.batch_id} (max_parallel {confirmation.max_parallel})")


def on_cluster(deps: Deps, slug: str, executors: Any) -> None:
    """A named agent's attempts on the Ray cluster the batch's authorization names (its runner), if it names one.
    An --executor command runs here whatever the runner: it is a program of this machine."""
    from lanes_es.domain.runner import is_ray

    current = current_authorization(deps, slug)
    if current is not None and is_ray(current.runner) and executors.agent is not None:
        executors.remote = deps.adapters.remote_attempts(current.runner, current.batch_id)


def changes_budgets(deps: Deps, slug: str, options: BatchOptions) -> bool:
    """Budgets given that differ from those recorded: a fresh confirmation records them (the gate asks)."""
    from lanes_es.domain.executor_budget import with_values

    if not options.executor_budget:
        return False
    recorded = recorded_budgets(deps, slug)
    return with_values(recorded, options.executor_budget) != with_values(recorded, {})


def recorded_budgets(deps: Deps, slug: str) -> Any:
    current = current_authorization(deps, slug)
    return current.executor_budget if current is not None else None


def refuse_unbounded_budgets(budgets: Any, agent: Any) -> None:
    """Budgets the Executor cannot be held to (one that reports no cost, by dollars; a command, by anything but
    its attempts) are refused, naming them and what bounds it."""
    from lanes_es.domain.executor_budget import option, unbounded_by
    from lanes_es.steward.executors import executor_bounds

    bounds = executor_bounds(agent)
    unbounded = unbounded_by(budgets, bounds)
    if not unbounded:
        return
    names = ", ".join(option(scope, measure) for scope, measure in unbounded)
    who = f"{agent.name} reports no cost" if agent is not None else "an --executor command reports nothing of itself"
    allowed = ", ".join(option("lane", measure) for measure in ("attempts", "wall", "tokens", "cost")
                        if measure in bounds)
    clear = " ".join(f"{option(scope, measure)} none" for scope, measure in unbounded)
    raise ServiceError("budget_unenforceable", f"{names} cannot bound this Executor ({who}); nothing was run: "
                                               f"bound it by {allowed} (or the --initiative-budget-* of these) "
                                               f"instead; a budget already confirmed is cleared with `{clear}`")


def runs_on_cluster(deps: Deps, slug: str, options: BatchOptions) -> bool:
    """Whether the batch this run confirms or goes on with runs on a Ray cluster: the runner given, else the one
    its Initiative's last confirmation recorded (what the confirmation records again)."""
    from lanes_es.domain.runner import is_ray

    if options.runner:
        return is_ray(options.runner)
    current = current_authorization(deps, slug)
    return current is not None and is_ray(current.runner)


def refuse_cluster_without_token(on_nodes: bool) -> None:
    """A batch on a Ray cluster whose token is missing here is refused before anything is confirmed (read from
    the environment and Ray's token file, without connecting: the first tick connects)."""
    if not on_nodes:
        return
    from lanes_es.adapters.ray_cluster import RayUnavailable, require_token_auth

    try:
        require_token_auth()
    except RayUnavailable as error:
        raise ServiceError("runner_unavailable", f"{error}; nothing was confirmed") from None


def executors_for(argv: list[str], root: str, logs: Path, extra_env: Mapping[str, str] | None,
                  attempt_seconds: int, on_nodes: bool = False) -> Executors:
    """The Executors of `--executor`: a named agent (its program found on PATH; `on_nodes`, a Ray runner's: on
    each node's PATH, where it runs, not here), or the command as given."""
    from lanes_es.executors import agent_named

    agent = agent_named(argv[0]) if len(argv) == 1 else None
    if agent is None:
        return Executors(list(argv), root, logs, extra_env=extra_env)
    program = agent.program if on_nodes else agent_program(agent)
    return Executors([program], root, logs, extra_env=extra_env, agent=agent, attempt_seconds=attempt_seconds)


def agent_program(agent: Any) -> str:
    """The named agent's program on this machine's PATH; refused (`invalid_executor`) when it is not there."""
    import shutil

    program = shutil.which(agent.program)
    if program is None:
        raise ServiceError("invalid_executor", f"{agent.program} (for --executor {agent.name}) is not on PATH; "
                                               f"install it (see the how-to 'agent-{agent.name}' of the docs), "
                                               f"then run again")
    return program


def attempt_recorder(deps: Deps) -> Record:
    """Each attempt's facts, recorded in the batch's log under its lock. The checkpoint is not brought up after
    each (two git spawns and a signature each time, eight times over for eight Lanes): the next tick brings
    it up to the whole log, and the run, when it ends with no tick after, by `attempts_anchor`."""
    from lanes_es.executor_log import record_executor_facts

    return lambda batch_id, change: record_executor_facts(deps.store, deps.now, batch_id, change)


def attempts_anchor(deps: Deps) -> Callable[[str], Any]:
    """The checkpoint of a batch brought up to its log (as after a tick)."""
    from lanes_es.usecases.save import anchor

    return lambda batch_id: anchor(deps, deps.root, deps.store.batch(batch_id))


def holder_facts(holder: LeaseHolder) -> dict[str, Any]:
    return {"holder": {"pid": holder.pid, "host": holder.host, "since": holder.since, "expires": holder.expires}}


def choose_progress(out: Out, live: bool, json_lines: bool) -> Progress:
    if json_lines:
        return JsonProgress(out)
    if live:
        from lanes_es.steward.live import LiveProgress  # rich: only a terminal pays for its import

        return LiveProgress()
    return LineProgress(out)


def ask_on_stderr(question: str) -> str:
    """With --json, stdout carries JSON only: the confirmation question goes to stderr."""
    sys.stderr.write(question)
    sys.stderr.flush()
    return input()


def interrupted_text(running: Mapping[str, Any]) -> str:
    """What Ctrl-C left behind, as it is: which Executors stopped with it and which outlived it (by pid)."""
    working = sorted(task for task, r in running.items() if still_working(r.process))
    stopped = sorted(task for task in running if task not in working)
    text = "lanes-es run: interrupted; the log and git keep every step already taken"
    if stopped:
        text += f"; the Executors of {', '.join(stopped)} stopped with it (the next run starts them again)"
    if working:
        pids = ", ".join(f"{task} (pid {running[task].process.pid})" for task in working)
        text += f"; Executors still working: {pids} (the next run waits for them; kill PID stops one)"
    return text + ". Run the same command again to go on."


def still_working(process: Any) -> bool:
    """Ctrl-C on a terminal reaches the Executors too (one process group): a moment to see which outlived it."""
    deadline = time.monotonic() + 0.5
    while process.poll() is None:
        if time.monotonic() > deadline:
            return True
        time.sleep(0.02)
    return False


def nothing_to_run(deps: Deps, slug: str, out: Out, refuse: Out) -> int:
    """Every task is settled: 0 when the Initiative's last batch completed (running again is harmless)."""
    batch = active_batch(deps, slug)
    if batch is not None and batch.batch_state == "completed":
        out(f"lanes-es run: nothing to run: batch {batch.id} of Initiative {slug} completed and no task is left; "
            f"add tasks to docs/initiatives/{slug}.md to run a new batch")
        return EXIT_OK
    refuse(f"lanes-es run: Initiative {slug} has no enrollable task; `lanes-es plan {slug}` shows why each is "
           f"excluded")
    return EXIT_REFUSED

