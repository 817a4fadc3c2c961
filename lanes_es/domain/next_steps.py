"""What to do next, said as commands: the command line's reading of a report.

A report keeps upstream's `next_action` text, which names upstream's MCP tool
(`start_unattended_batch`); over MCP that is the right word. The command line says the same
advice with the commands that move the batch on. Pure: a report (or a record shaped like one)
in, a line out.
"""

from __future__ import annotations

from typing import Any

# Park reasons a fresh confirmation cannot resume: the Lane no longer holds a run of the task.
UNRESUMABLE = ("Kernel reported the child stopped", "batch_lane_run_mismatch", "batch_lane_contract_mismatch",
               "parked child has no recoverable owned run", "parked Lane identity or decision is unresolved",
               "batch_plan_digest_changed")


OFFER_REFUSAL_HINTS = {
    "batch_lane_foreign_repository": "offer the top level of a worktree of this repository (git worktree add)",
    "batch_lane_is_coordinator": "the coordinator runs no child; make a separate worktree",
    "batch_lane_branch_mismatch": "the Lane must sit on imm-lane/<slug>/<task>",
    "batch_lane_base_mismatch": "cut the Lane at the provision handoff's base_head (git -C LANE reset --hard BASE "
                                "on an unused Lane)",
    "batch_lane_dirty": "the Lane must be clean: commit nothing yourself and remove stray files",
    "batch_lane_unknown_child": "offer only children named in a provision handoff of the last tick",
}


def offer_refusal_hint(reason: str, path: str) -> str:
    """What to do about a Lane the batch refused to admit."""
    if reason == "batch_lane_occupied":
        return (f"the Lane already holds a run, of this batch's or an earlier (retired) batch's task: keep what you "
                f"need from it, then remove it (`git worktree remove --force {path}` and `git branch -D` its "
                f"branch) so a fresh Lane can be made there, or offer a fresh worktree")
    return OFFER_REFUSAL_HINTS.get(reason, "")


def failed_final_verification(report: dict[str, Any]) -> list[str]:
    """The final-verification commands that failed on a completed batch (none when it passed or had none)."""
    final = report.get("final_verification")
    if report.get("batch_state") != "completed" or not isinstance(final, dict) or final.get("passed", True):
        return []
    return [result.get("command", "?") for result in final.get("results", []) if not result.get("passed")]


def needs_a_person(report: dict[str, Any]) -> bool:
    """The batch stopped where only a person moves it: parked, out of budget, failed, retired, or completed
    with a failed final verification (upstream records `completed`; the branch is not fit to land)."""
    return (report.get("batch_state") in ("needs_human", "budget_stopped", "failed", "superseded")
            or bool(failed_final_verification(report)))


def command_line_next(report: dict[str, Any], autopilot: bool = False) -> str:
    """The next step as commands. `autopilot`: said to someone running `lanes-es run`, which ticks, makes and
    offers Lanes and asks for confirmations itself."""
    slug = report.get("initiative_slug", "SLUG")
    again = "run the same `lanes-es run` command again" if autopilot else f"`lanes-es tick {slug}`"
    state = report.get("batch_state")
    if state == "completed":
        failed = failed_final_verification(report)
        land = f"`lanes-es land {slug}` (a fast-forward of your branch; `--onto BRANCH` names another)"
        if failed:
            return (f"every child is integrated, but the final verification failed ({', '.join(failed)}); nothing "
                    f"was rolled back: fix it on imm/{slug} (run the command there to see why) before you land it "
                    f"with {land}")
        return f"review the commits (`git log --oneline main..imm/{slug}`), then land them: {land}"
    if state == "needs_human":
        return _parked_next(report, slug, autopilot)
    if state == "budget_stopped":
        return (f"the confirmed number of children (max_children) is used up; a new confirmation "
                f"(`lanes-es authorize {slug}`, or run again) starts a batch for the tasks still to do")
    if state == "failed":
        return (f"the batch branch imm/{slug} was rewritten under the batch (see the reason); inspect it with "
                f"`git log imm/{slug}`; a new batch of {slug} needs that branch landed and deleted first")
    if state == "superseded":
        return f"this batch was retired; `lanes-es run {slug} ...` (or `lanes-es authorize {slug}`) starts a new one"
    if state == "rejected":
        return _rejected_next(report.get("reason") or "", slug, again)
    return _running_next(report, slug, again, autopilot)


def _rejected_next(reason: str, slug: str, again: str) -> str:
    if reason.startswith(("dirty_working_tree", "working_tree_unstaged", "working_tree_dirty")):
        return (f"commit, stash or move away the changes the reason names (`git status` shows them; lanes-es never "
                f"folds them into the batch), then {again}")
    if reason.startswith("batch_branch_exists"):
        return (f"imm/{slug} is the branch of an earlier batch: land it (`lanes-es land {slug} --onto main`, a "
                f"fast-forward) and delete it (`git branch -d imm/{slug}`), or `git switch imm/{slug}` to go on from "
                f"it; then {again}")
    return f"fix what the reason names, then {again}"


def _parked_next(report: dict[str, Any], slug: str, autopilot: bool) -> str:
    parked = [child for child in report.get("children", []) if child.get("state") == "needs_human"]
    stuck = [child["task_id"] for child in parked
             if any(marker in (child.get("reason") or "") for marker in UNRESUMABLE)]
    if any(marker in (report.get("reason") or "") for marker in UNRESUMABLE) and parked and not stuck:
        stuck = [child["task_id"] for child in parked]
    if stuck:
        return (f"{', '.join(stuck)} cannot resume in this batch (its Lane holds no run to go on with): "
                f"`lanes-es retire {slug}` ends the batch, then run {slug} again; its Lanes are kept: remove each "
                f"with `git worktree remove PATH` and `git branch -D imm-lane/{slug}/TASK` once you have what you "
                f"need from it")
    resume = "run the same `lanes-es run` command again (it asks for the confirmation)" if autopilot else \
        f"`lanes-es authorize {slug}` confirms it again and the next `lanes-es tick {slug}` resumes it"
    return (f"resolve each parked child (its reason is above; docs/how-to/recover-from-park.md says how), then "
            f"{resume}; or `lanes-es retire {slug}` ends the batch")


def _running_next(report: dict[str, Any], slug: str, again: str, autopilot: bool) -> str:
    handoffs = report.get("handoffs", [])
    roles = {handoff.get("role") for handoff in handoffs}
    if "coordinator" in roles:
        return (f"read the findings in each Lane named above (`lanes-es task status` there), then send one "
                f"design-level correction: `lanes-es tick {slug} --instruction '{{\"task_id\": \"TASK\", \"kind\": "
                f"\"correction\", \"text\": \"...\", \"session_state\": \"idle\"}}'`")
    if "open Review reservation" in (report.get("reason") or ""):
        return (f"record each Review in its Lane (`lanes-es task review --approve`, or `--reject TEXT`), "
                f"then {again}")
    if any(handoff.get("action") == "provision" for handoff in handoffs) and not autopilot:
        return (f"make a Lane for each provision handoff (the `git worktree add` shown), then "
                f"`lanes-es tick {slug} --offer TASK=PATH` for each")
    return (f"run each Executor in its Lane (it ends with `lanes-es task submit` there), then {again}"
            if "executor" in roles else f"{again}")
