"""Executor budgets: what a Lane's attempts, and the attempts of all a batch's Lanes together, may take.

Pure. A confirmation sets them (`ExecutorBudgets`, recorded with the authorization); what was spent is
folded from the batch's log (lanes_es/domain/executor_runs.py), live attempts added by the autopilot.
Four measures, each bounded or not: attempts, wall (the attempts' wall-clock seconds added up, so two
Lanes working for a minute spend two), tokens (in and out, as the agents report them) and cost (dollars,
as they report it). A budget is spent once what was spent reaches its limit:

- `decide_start`: an attempt starts only while neither the Lane's budget nor the Initiative's is spent,
  and is given what is left of both as its limits (its wall-clock timeout, tokens, dollars);
- `spent_while_running`: the Initiative's budget, with what the running attempts reported so far, ends
  them all once it is spent (one Lane's attempt is bounded by its own limits);
- `unbounded_by`: the measures an Executor cannot be held to (one that reports no cost cannot be
  bounded by dollars), refused before a batch runs.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from lanes_es.domain import events as ev
from lanes_es.domain.executor_runs import Spent

LANE, INITIATIVE = "lane", "initiative"
ATTEMPTS, WALL, TOKENS, COST = "attempts", "wall", "tokens", "cost"
MEASURES = (ATTEMPTS, WALL, TOKENS, COST)
RUNNING_MEASURES = (WALL, TOKENS, COST)  # a started attempt has counted already
MAX_WALL_SECONDS = 366 * 24 * 3600
MAX_TOKENS = 10**12
MAX_COST_USD = 1_000_000.0
NO_BUDGETS = ev.ExecutorBudgets()


class InvalidBudget(ValueError):
    """A budget value that is not one."""


# ---------------------------------------------------------------- the option of each budget


def option(scope: str, measure: str) -> str:
    """The command-line option that sets a budget: --lane-budget-attempts, --initiative-budget-usd, ..."""
    return f"--{scope}-budget-{'usd' if measure == COST else measure}"


def with_values(budgets: ev.ExecutorBudgets | None,
                given: dict[tuple[str, str], float | int | None]) -> ev.ExecutorBudgets:
    """`budgets` with the measures in `given` ((scope, measure) -> limit, None: no bound) set; the others kept."""
    budgets = budgets or NO_BUDGETS
    scopes = {}
    for scope in (LANE, INITIATIVE):
        budget = getattr(budgets, scope)
        values = {FIELD[measure]: given[(scope, measure)] for measure in MEASURES if (scope, measure) in given}
        scopes[scope] = ev.ExecutorBudget(**{**budget.plain(), **values})
    return ev.ExecutorBudgets(**scopes)


FIELD = {ATTEMPTS: "attempts", WALL: "wall_seconds", TOKENS: "tokens", COST: "cost_usd"}


def limit(budget: ev.ExecutorBudget, measure: str) -> float | None:
    return getattr(budget, FIELD[measure])


def is_set(budgets: ev.ExecutorBudgets | None) -> bool:
    return budgets is not None and budgets != NO_BUDGETS


# ---------------------------------------------------------------- parsing the values


def parse_duration(text: str) -> int:
    """Seconds from `90`, `90s`, `45m`, `2h` or `1h30m`: more than 0, at most a year."""
    match = re.fullmatch(r"\s*(?:(\d+)h)?\s*(?:(\d+)m)?\s*(?:(\d+)s?)?\s*", text)
    if not text.strip() or match is None or not any(match.groups()):
        raise InvalidBudget(f"{text!r} is not a duration: write seconds (900), or with units (45m, 2h, 1h30m)")
    hours, minutes, seconds = (int(part or 0) for part in match.groups())
    total = hours * 3600 + minutes * 60 + seconds
    if not 0 < total <= MAX_WALL_SECONDS:
        raise InvalidBudget(f"{text!r}: a wall-time budget is more than 0 and at most {MAX_WALL_SECONDS // 86400} days")
    return total


def parse_tokens(text: str) -> int:
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise InvalidBudget(f"{text!r} is not a number of tokens") from None
    if not 0 < value <= MAX_TOKENS:
        raise InvalidBudget(f"{text!r}: a token budget is more than 0 and at most {MAX_TOKENS}")
    return value


def parse_attempts(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise InvalidBudget(f"{text!r} is not a number of attempts") from None
    if not 0 < value <= 10_000:
        raise InvalidBudget(f"{text!r}: an attempt budget is 1 to 10000")
    return value


def parse_dollars(text: str) -> float:
    try:
        value = float(text.strip().removeprefix("$"))
    except ValueError:
        raise InvalidBudget(f"{text!r} is not an amount of dollars") from None
    if not (0 < value <= MAX_COST_USD) or math.isnan(value):
        raise InvalidBudget(f"{text!r}: a cost budget is more than 0 and at most {MAX_COST_USD:g} dollars")
    return round(value, 6)


PARSERS = {ATTEMPTS: parse_attempts, WALL: parse_duration, TOKENS: parse_tokens, COST: parse_dollars}


# ---------------------------------------------------------------- amounts, as said


def amounts(spent: Spent) -> dict[str, float]:
    return {ATTEMPTS: spent.attempts, WALL: spent.duration_ms / 1000, TOKENS: spent.tokens, COST: spent.cost_usd}


def amount_text(measure: str, value: float) -> str:
    if measure == ATTEMPTS:
        return f"{int(value)} attempt{'s' if value != 1 else ''}"
    if measure == WALL:
        return duration_text(value)
    if measure == TOKENS:
        return f"{int(value)} tokens"
    return f"${value:.2f}" if value >= 1 or value == 0 else f"${value:.4f}"


def duration_text(seconds: float) -> str:
    """`1h30m`, `28m30s`, `45s`, `0s`: whole seconds up, as --*-budget-wall takes them."""
    whole = int(math.ceil(seconds))
    parts = [(whole // 3600, "h"), ((whole % 3600) // 60, "m"), (whole % 60, "s")]
    return "".join(f"{value}{unit}" for value, unit in parts if value) or "0s"


def value_text(measure: str, value: float) -> str:
    """A limit as its option takes it: 4, 45m, 200000, 2.5."""
    if measure == WALL:
        return duration_text(value)
    if measure == COST:
        return f"{value:.2f}".rstrip("0").rstrip(".")
    return str(int(value))


def scope_text(scope: str) -> str:
    return "the Lane's" if scope == LANE else "the Initiative's"


def budget_text(budget: ev.ExecutorBudget) -> str:
    """`3 attempts, 30m, 200000 tokens, $2.00`, or `none`."""
    parts = [amount_text(measure, value) for measure in MEASURES if (value := limit(budget, measure)) is not None]
    return ", ".join(parts) or "none"


def budgets_text(budgets: ev.ExecutorBudgets) -> str:
    return f"per Lane: {budget_text(budgets.lane)}; for the Initiative (all its Lanes): {budget_text(budgets.initiative)}"


# ---------------------------------------------------------------- decisions


@dataclass(frozen=True)
class Exhausted:
    """A budget that is spent: its scope, the measure that ran out, its limit and what was spent."""

    scope: str
    measure: str
    limit: float
    spent: float

    def text(self) -> str:
        return (f"{scope_text(self.scope)} budget of {amount_text(self.measure, self.limit)} is spent "
                f"({amount_text(self.measure, self.spent)} used)")

    def raise_text(self, slug: str) -> str:
        """How to give the work more: a stopped task does not resume, so in a new batch with a higher limit."""
        higher = value_text(self.measure, self.limit * 2 if self.measure != ATTEMPTS else self.limit + 2)
        return (f"a stopped task does not resume in this batch: to give it more, `lanes-es retire {slug}`, remove "
                f"its Lane, then run {slug} again with a higher {option(self.scope, self.measure)} "
                f"(e.g. `lanes-es run {slug} ... {option(self.scope, self.measure)} {higher}`)")


def exhausted(budget: ev.ExecutorBudget, spent: Spent, scope: str,
              measures: tuple[str, ...] = MEASURES) -> Exhausted | None:
    """The first of `measures` whose limit `spent` has reached, None while each has something left."""
    have = amounts(spent)
    for measure in measures:
        bound = limit(budget, measure)
        if bound is not None and have[measure] >= bound:
            return Exhausted(scope, measure, bound, have[measure])
    return None


def left(budget: ev.ExecutorBudget, spent: Spent) -> dict[str, float | None]:
    """What is left of each measure (None: unbounded), never below 0."""
    have = amounts(spent)
    return {measure: None if (bound := limit(budget, measure)) is None else max(bound - have[measure], 0)
            for measure in MEASURES}


@dataclass(frozen=True)
class AttemptStart:
    """An attempt may start with these limits; `wall_detail` says which budget bounds its wall clock when one
    does (its kill at the timeout is then a budget stop, not a timeout)."""

    limits: ev.AttemptLimits
    wall_detail: str | None = None


def decide_start(budgets: ev.ExecutorBudgets | None, lane_spent: Spent, initiative_spent: Spent,
                 attempt_seconds: int) -> AttemptStart | Exhausted:
    """Whether a task's next attempt starts: not when the Lane's or the Initiative's budget is spent (the
    Lane's said first); else its limits: the least of `attempt_seconds` and each budget's wall time left,
    and of each budget's tokens and dollars left."""
    budgets = budgets or NO_BUDGETS
    for scope, spent in ((LANE, lane_spent), (INITIATIVE, initiative_spent)):
        found = exhausted(getattr(budgets, scope), spent, scope)
        if found is not None:
            return found
    lefts = {LANE: left(budgets.lane, lane_spent), INITIATIVE: left(budgets.initiative, initiative_spent)}
    timeout, wall_detail = attempt_seconds, None
    for scope in (LANE, INITIATIVE):
        wall = lefts[scope][WALL]
        if wall is not None and math.ceil(wall) < timeout:
            timeout = max(int(math.ceil(wall)), 1)
            wall_detail = (f"the attempt reached {scope_text(scope)} wall-time budget of "
                           f"{amount_text(WALL, limit(getattr(budgets, scope), WALL) or 0)} "
                           f"({amount_text(WALL, timeout)} were left when it started)")
    tokens = least(lefts[LANE][TOKENS], lefts[INITIATIVE][TOKENS])
    cost = least(lefts[LANE][COST], lefts[INITIATIVE][COST])
    return AttemptStart(ev.AttemptLimits(timeout_seconds=timeout, tokens=None if tokens is None else int(tokens),
                                         cost_usd=None if cost is None else round(cost, 6)), wall_detail)


def spent_while_running(budgets: ev.ExecutorBudgets | None, initiative_spent: Spent) -> Exhausted | None:
    """The Initiative's budget, spent by what was recorded and what the running attempts reported so far:
    every running attempt ends. Attempts are not counted here: a started attempt counted when it started."""
    budgets = budgets or NO_BUDGETS
    return exhausted(budgets.initiative, initiative_spent, INITIATIVE, RUNNING_MEASURES)


def least(*values: float | None) -> float | None:
    bounded = [value for value in values if value is not None]
    return min(bounded) if bounded else None


def unbounded_by(budgets: ev.ExecutorBudgets | None, bounds: frozenset[str]) -> list[tuple[str, str]]:
    """The (scope, measure) budgets set that an Executor bounding only `bounds` cannot be held to."""
    budgets = budgets or NO_BUDGETS
    return [(scope, measure) for scope in (LANE, INITIATIVE) for measure in MEASURES
            if limit(getattr(budgets, scope), measure) is not None and measure not in bounds]
