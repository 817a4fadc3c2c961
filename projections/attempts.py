"""The Executor attempts of a batch as `status` shows them: per task, each attempt and what they added up to.

Pure: a function of the aggregate's folded attempts (lanes_es/domain/executor_runs.py). The v2 record
has no place for them; `status --json` gives them under `executor_attempts`, beside the record's keys.
"""

from __future__ import annotations

from typing import Any

from lanes_es.domain import events as ev
from lanes_es.domain.executor_runs import Attempt, ExecutorRuns


def attempt_facts(attempt: Attempt) -> dict[str, Any]:
    started, ended = attempt.started, attempt.ended
    facts: dict[str, Any] = {"attempt": started.attempt, "adapter": started.adapter, "obligation": started.obligation,
                             "started_at": started.at}
    if ended is None:
        facts["outcome"] = "under_way"
    elif type(ended) is ev.ExecutorRunKilled:
        facts.update(outcome="killed", reason=ended.reason, detail=ended.detail, ended_at=ended.at,
                     duration_ms=ended.duration_ms)
    else:
        facts.update(outcome="exited", exit_code=ended.exit_code, submitted=ended.submitted, ended_at=ended.at,
                     duration_ms=ended.duration_ms)
    facts["usage"] = attempt.usage.plain()
    return facts


def attempts_json(runs: ExecutorRuns) -> dict[str, Any]:
    return {task_id: {"attempts": [attempt_facts(attempt) for attempt in attempts],
                      "total": total.plain()}
            for (task_id, attempts), total in zip(runs.attempts.items(), runs.totals())}


def attempts_lines(runs: ExecutorRuns) -> list[str]:
    if not runs.attempts:
        return []
    lines = ["executor attempts:"]
    for total, attempts in zip(runs.totals(), runs.attempts.values()):
        killed = f", {total.killed} killed" if total.killed else ""
        lines.append(f"  {total.task_id}: {total.attempts} attempt{'s' if total.attempts != 1 else ''}{killed}, "
                     f"{total.duration_ms / 1000:.1f}s{usage_text(total.tokens_in, total.tokens_out, total.cost_usd)}")
        for attempt in attempts:
            facts = attempt_facts(attempt)
            if facts["outcome"] == "killed":
                how = f"killed ({facts['reason']}: {facts['detail']})"
            elif facts["outcome"] == "exited":
                submitted = {True: ", submitted", False: ", not submitted", None: ""}[facts["submitted"]]
                how = f"exit {facts['exit_code']}{submitted}"
            else:
                how = "under way"
            usage = attempt.usage
            lines.append(f"    #{facts['attempt']} {facts['adapter']} {facts['obligation']}: {how}"
                         f"{usage_text(usage.tokens_in, usage.tokens_out, usage.cost_usd)}")
    return lines


def usage_text(tokens_in: int | None, tokens_out: int | None, cost: float | None) -> str:
    parts = []
    if tokens_in is not None or tokens_out is not None:
        parts.append(f"{tokens_in or 0} tokens in / {tokens_out or 0} out")
    if cost is not None:
        parts.append(f"${cost:.4f}")
    return f", {', '.join(parts)}" if parts else ""


# ---------------------------------------------------------------- budgets: spent and left


def budget_json(runs: ExecutorRuns, budgets: ev.ExecutorBudgets | None, task_ids: list[str]) -> dict[str, Any]:
    """The Executor budgets, and per Lane and for the Initiative what was spent and what is left (None: no bound)."""
    from lanes_es.domain.executor_budget import amounts, left

    budgets = budgets or ev.ExecutorBudgets()

    def account(budget: ev.ExecutorBudget, spent: Any) -> dict[str, Any]:
        return {"spent": amounts(spent), "left": left(budget, spent)}

    return {"lane": budgets.lane.plain(), "initiative": budgets.initiative.plain(),
            "lanes": {task_id: account(budgets.lane, runs.spent(task_id)) for task_id in task_ids},
            "all_lanes": account(budgets.initiative, runs.spent_in_all()),
            "stopped": {task_id: {"scope": event.scope, "measure": event.measure, "detail": event.detail}
                        for task_id, event in runs.exhausted.items()}}


def budget_lines(runs: ExecutorRuns, budgets: ev.ExecutorBudgets | None, task_ids: list[str]) -> list[str]:
    """`status`'s lines: each Lane's and the Initiative's spent and left, and the tasks stopped for a budget."""
    from lanes_es.domain.executor_budget import budgets_text, is_set

    if not is_set(budgets) and not runs.exhausted:
        return []
    assert budgets is not None or runs.exhausted
    budgets = budgets or ev.ExecutorBudgets()
    lines = [f"executor budget: {budgets_text(budgets)}"]
    for task_id in task_ids:
        lines.append(f"  {task_id}: {account_text(budgets.lane, runs.spent(task_id))}")
    lines.append(f"  the Initiative (all Lanes): {account_text(budgets.initiative, runs.spent_in_all())}")
    for task_id, event in runs.exhausted.items():
        lines.append(f"  {task_id} was stopped: {event.detail}")
    return lines


def account_text(budget: ev.ExecutorBudget, spent: Any) -> str:
    """`spent 2 attempts, 41s, 3300 tokens, $0.15; left 1 attempt, $0.85` (left: of the bounded measures)."""
    from lanes_es.domain.executor_budget import MEASURES, amount_text, amounts, left

    have, remaining = amounts(spent), left(budget, spent)
    spent_text = ", ".join(amount_text(measure, have[measure]) for measure in MEASURES)
    bounded = [amount_text(measure, value) for measure in MEASURES if (value := remaining[measure]) is not None]
    return f"spent {spent_text}" + (f"; left {', '.join(bounded)}" if bounded else "")
