"""The Executor attempts of a batch, folded from its log: who ran, how long, what it spent.

Pure. The aggregate folds every ExecutorRun event (each InterventionRecorded, whose text the next attempt
of its task is given, and each ExecutorBudgetExhausted) into an `ExecutorRuns`; the autopilot reads from it the next
attempt's number, the corrections not yet handed to an attempt, and what each Lane has spent, and
a settling batch records each task's totals in its report's extras (in the log only).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from . import events as ev

ENDED = (ev.ExecutorRunFinished, ev.ExecutorRunKilled)


@dataclass
class Attempt:
    """One attempt: its start, and its end once recorded."""

    started: ev.ExecutorRunStarted
    ended: ev.ExecutorRunFinished | ev.ExecutorRunKilled | None = None

    @property
    def usage(self) -> ev.ExecutorUsage:
        return self.ended.usage if self.ended is not None else ev.ExecutorUsage()

    @property
    def duration_ms(self) -> int:
        return (self.ended.duration_ms or 0) if self.ended is not None else 0


@dataclass(frozen=True)
class Spent:
    """What attempts took, added up; tokens and cost count only what the agents reported."""

    attempts: int = 0
    duration_ms: int = 0
    tokens: int = 0
    cost_usd: float = 0.0

    def __add__(self, other: "Spent") -> "Spent":
        return Spent(self.attempts + other.attempts, self.duration_ms + other.duration_ms,
                     self.tokens + other.tokens, self.cost_usd + other.cost_usd)


@dataclass
class ExecutorRuns:
    attempts: dict[str, list[Attempt]] = field(default_factory=dict)
    # Interventions (corrections, instructions) recorded since the task's latest attempt started.
    undelivered: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    # The tasks stopped because a budget was spent (lanes_es/domain/executor_budget.py), with why.
    exhausted: dict[str, ev.ExecutorBudgetExhausted] = field(default_factory=dict)

    def fold(self, event: Any) -> None:
        kind = type(event)
        if kind is ev.ExecutorRunStarted:
            self.attempts.setdefault(event.task_id, []).append(Attempt(event))
            self.undelivered.pop(event.task_id, None)
        elif kind in ENDED:
            self.attempts[event.task_id][event.attempt - 1].ended = event
        elif kind is ev.InterventionRecorded:
            self.undelivered.setdefault(event.task_id, []).append((event.kind, event.text))
        elif kind is ev.ExecutorBudgetExhausted:
            self.exhausted[event.task_id] = event

    # ------------------------------------------------------------ reading

    def of(self, task_id: str) -> list[Attempt]:
        return self.attempts.get(task_id, [])

    def next_attempt(self, task_id: str) -> int:
        return len(self.of(task_id)) + 1

    def open_attempt(self, task_id: str) -> Attempt | None:
        """The task's latest attempt when it has not ended."""
        found = self.of(task_id)
        return found[-1] if found and found[-1].ended is None else None

    def spent(self, task_id: str) -> Spent:
        return sum((spent_by(attempt) for attempt in self.of(task_id)), Spent())

    def spent_in_all(self) -> Spent:
        return sum((self.spent(task_id) for task_id in self.attempts), Spent())

    def totals(self) -> list[ev.ExecutorTotal]:
        return [total_of(task_id, attempts) for task_id, attempts in self.attempts.items()]


def spent_by(attempt: Attempt) -> Spent:
    usage = attempt.usage
    return Spent(1, attempt.duration_ms, (usage.tokens_in or 0) + (usage.tokens_out or 0), usage.cost_usd or 0.0)


def total_of(task_id: str, attempts: Iterable[Attempt]) -> ev.ExecutorTotal:
    attempts = list(attempts)
    usages = [attempt.usage for attempt in attempts]
    return ev.ExecutorTotal(
        task_id=task_id, attempts=len(attempts),
        killed=sum(1 for attempt in attempts if isinstance(attempt.ended, ev.ExecutorRunKilled)),
        duration_ms=sum(attempt.duration_ms for attempt in attempts),
        tokens_in=_sum(usage.tokens_in for usage in usages), tokens_out=_sum(usage.tokens_out for usage in usages),
        cost_usd=_rounded(_sum(usage.cost_usd for usage in usages)))


def _sum(values: Iterable[Any]) -> Any:
    """The sum of the reported values; None when no attempt reported one."""
    reported = [value for value in values if value is not None]
    return sum(reported) if reported else None


def _rounded(cost: float | None) -> float | None:
    # Costs are summed as floats: rounded to a millionth of a dollar, the sum reads as the agents said it.
    return None if cost is None else round(cost, 6)
