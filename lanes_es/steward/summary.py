"""The summary the autopilot ends with: the batch, each child, the Lanes kept, and what to do next."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from lanes_es.exit_codes import EXIT_NEEDS_PERSON, EXIT_OK, EXIT_REFUSED

if TYPE_CHECKING:
    from lanes_es.steward.loop import Autopilot


def summary_lines(autopilot: Autopilot, report: dict[str, Any], stopped_for: str | None) -> list[str]:
    state = report["batch_state"]
    lines = ["", f"batch {report['batch_id']}: {state}" + (f": {report['reason']}" if report.get("reason") else "")]
    for child in report["children"]:
        commit = f" {child['commit'][:12]}" if child.get("commit") else ""
        reason = f" ({child['reason']})" if child.get("reason") else ""
        lines.append(f"  {child['task_id']:<24} {child['state']}{commit}{reason}{released_note(autopilot, child)}")
    released = len(autopilot.released)
    lines.append(f"{len(report['commits'])} commit{'s' if len(report['commits']) != 1 else ''} on "
                 f"imm/{report['initiative_slug']}; {released} Lane{'s' if released != 1 else ''} "
                 f"released by the steward")
    lines += coordinator_lines(autopilot)
    lines += budget_stop_lines(autopilot, report)
    lines += kept_lines(autopilot, report)
    lines += waiting_lines(autopilot, report)
    lines.append(f"next: {next_step(report, stopped_for)}")
    return lines


def coordinator_lines(autopilot: Autopilot) -> list[str]:
    """Where the batch ran, when not in the user's checkout (docs/concepts/coordinator.md)."""
    deps = autopilot.deps
    if deps.checkout is None:
        return []
    return [f"the batch ran in its coordinator worktree {deps.root} (`lanes-es status "
            f"{autopilot.slug}` says so again); your checkout {deps.checkout} was left as it was"]


def released_note(autopilot: Autopilot, child: dict[str, Any]) -> str:
    """The child's state in the report, and the steward's release the report cannot hold yet: the Lanes
    of a settled batch are released after its last tick, so no tick records their `released`."""
    if child["state"] == "integrated" and child["task_id"] in autopilot.released:
        return ", its Lane released by the steward after the last tick"
    return ""


def exit_code(report: dict[str, Any]) -> int:
    """0 completed, 2 rejected, 3 anything else the run stopped on (a failed final verification too)."""
    from lanes_es.domain.next_steps import failed_final_verification

    if report["batch_state"] == "completed":
        return EXIT_NEEDS_PERSON if failed_final_verification(report) else EXIT_OK
    if report["batch_state"] == "rejected":
        return EXIT_REFUSED
    return EXIT_NEEDS_PERSON


def budget_stop_lines(autopilot: Autopilot, report: dict[str, Any]) -> list[str]:
    """The tasks stopped for an Executor budget (the park reason is upstream's fixed text), with the budget and
    how to raise it."""
    attempts = getattr(autopilot, "attempts", None)
    if attempts is None:
        return []
    batch = attempts.read(report["batch_id"])
    if batch is None:
        return []
    return [f"{task_id} was stopped for its Executor budget: {event.detail}"
            for task_id, event in batch.executor_runs.exhausted.items()]


def kept_lines(autopilot: Autopilot, report: dict[str, Any]) -> list[str]:
    lines = [f"kept the Lane of {task_id}: {why} (clean it, then `git worktree remove` it yourself)"
             for task_id, why in autopilot.kept.items()]
    if report["batch_state"] == "completed":
        for child in report["children"]:
            lane = child.get("lane")
            if (child["state"] == "integrated" and lane and child["task_id"] not in autopilot.released
                    and child["task_id"] not in autopilot.kept and os.path.lexists(lane["path"])):
                why = autopilot.steward.dirt(lane["path"]) or "the tick gave no release handoff for it"
                lines.append(f"kept the Lane of {child['task_id']}: {lane['path']}: {why} (a Lane is released "
                             f"only when clean: look with `git -C {lane['path']} status`, then remove it yourself)")
    return lines


def waiting_lines(autopilot: Autopilot, report: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    for task_id, why in autopilot.steward_refusals.items():
        lines.append(f"no Lane for {task_id}: {why}")
    for task_id, (reason, _) in autopilot.refused.items():
        if any(h.get("action") == "provision" and h["task_id"] == task_id for h in report["handoffs"]):
            from lanes_es.domain.next_steps import offer_refusal_hint

            path = str(autopilot.steward.lane_path(task_id))
            hint = offer_refusal_hint(reason, path)
            lines.append(f"the Lane of {task_id} at {path} was refused: {reason}" + (f" ({hint})" if hint else ""))
    for handoff in report["handoffs"]:
        if handoff["role"] == "executor":
            how = executor_note(autopilot, handoff)
            lines.append(f"{handoff['task_id']} waits for {handoff.get('next_obligation')} in "
                         f"{handoff['lane_path']}: {how}")
        elif handoff["role"] == "coordinator":
            lines.append(f"{handoff['task_id']} needs a design-level correction ({handoff['reason']}; "
                         f"{handoff['corrections_left']} left): read the findings in {handoff['lane_path']} "
                         f"(`lanes-es task status` there), then send one with "
                         f"`lanes-es tick {report['initiative_slug']} --instruction "
                         f"'{{\"task_id\": \"{handoff['task_id']}\", \"kind\": \"correction\", \"text\": \"...\", "
                         f"\"session_state\": \"idle\"}}'` and run again")
    return lines


def executor_note(autopilot: Autopilot, handoff: dict[str, Any]) -> str:
    """Why a task that waits for its Executor did not move: how its last attempt ended, or why none ran."""
    from lanes_es.steward.attempts import ended_text

    finished = autopilot.executors.finished.get(handoff["task_id"])
    if finished is not None and finished.result is not None and autopilot.executors.agent is not None:
        return f"its last attempt {ended_text(finished)}, without moving it (log {finished.log})"
    if finished is not None:
        return (f"its Executor exited with {finished.exit_code}{exit_meaning(finished.exit_code)} without moving it "
                f"(log {finished.log})")
    if autopilot.executors.agent is not None and handoff.get("next_obligation") == "run_review":
        return (f"{autopilot.executors.agent.name} delivers work, it does not review it: record the Review there "
                f"(`lanes-es task review --approve` or `--reject TEXT`)")
    return "no Executor ran"


def exit_meaning(code: int) -> str:
    """What a shell's exit status says, for the ones an Executor script commonly ends with."""
    meanings = {126: "a command it ran was found but could not be executed (its mode, or not a program)",
                127: "a command it ran was not found on its PATH (see the log for which)"}
    if code in meanings:
        return f" ({meanings[code]})"
    return f" (killed by signal {code - 128})" if 128 < code < 160 else ""


def next_step(report: dict[str, Any], stopped_for: str | None) -> str:
    from lanes_es.domain.next_steps import command_line_next

    if stopped_for == "coordinator":
        return "send the correction above, then run the same `lanes-es run` command again"
    if stopped_for == "stuck":
        return ("nothing more moves without you: settle what is listed above, then run the same "
                "`lanes-es run` command again")
    return command_line_next(report, autopilot=True)
