"""Executor budgets: their values, what is left of them, whether an attempt starts and with which limits, when
running attempts are ended, what an Executor cannot be held to, and the stop recorded in the log (once)."""

from __future__ import annotations

import msgspec
import pytest

from lanes_es.domain import events as ev
from lanes_es.domain import executor_budget as budget
from lanes_es.domain.aggregate import TransitionRefused
from lanes_es.domain.executor_runs import Spent
from lanes_es.projections.attempts import account_text, budget_lines
from tests.unit.test_executor_runs import USAGE, running_batch, started
from tests.unit.audit_logs import at

BUDGETS = budget.with_values(None, {("lane", "attempts"): 3, ("lane", "tokens"): 10_000, ("lane", "wall"): 600,
                                    ("initiative", "cost"): 2.0, ("initiative", "wall"): 1800})


@pytest.mark.parametrize("text, seconds", [("900", 900), ("1m1s", 61), ("90s", 90), ("45m", 2700), ("2h", 7200),
                                           ("1h30m", 5400), ("1h 5m 3s", 3903)])
def test_a_wall_budget_is_seconds_or_hours_and_minutes(text, seconds):
    assert budget.parse_duration(text) == seconds


@pytest.mark.parametrize("parse, text", [(budget.parse_duration, "0"), (budget.parse_duration, "soon"),
                                         (budget.parse_duration, ""), (budget.parse_duration, "400d"),
                                         (budget.parse_dollars, "-1"), (budget.parse_dollars, "nan"),
                                         (budget.parse_dollars, "inf"), (budget.parse_tokens, "0"),
                                         (budget.parse_tokens, "1e3"), (budget.parse_attempts, "0")])
def test_what_is_not_a_budget_is_refused(parse, text):
    with pytest.raises(budget.InvalidBudget):
        parse(text)


def test_a_new_confirmation_changes_the_budgets_given_keeps_the_others_and_clears_with_none():
    again = budget.with_values(BUDGETS, {("lane", "attempts"): 5, ("initiative", "cost"): None})
    assert again.lane == ev.ExecutorBudget(attempts=5, wall_seconds=600, tokens=10_000)
    assert again.initiative == ev.ExecutorBudget(wall_seconds=1800)
    assert budget.with_values(BUDGETS, {}) == BUDGETS
    assert not budget.is_set(budget.with_values(None, {})) and budget.is_set(BUDGETS)
    assert budget.budgets_text(BUDGETS) == ("per Lane: 3 attempts, 10m, 10000 tokens; for the Initiative (all its "
                                            "Lanes): 30m, $2.00")


def test_an_attempt_starts_with_the_least_of_what_is_left():
    start = budget.decide_start(BUDGETS, Spent(1, 120_000, 4_000, 0.5), Spent(2, 1_500_000, 9_000, 1.25), 3600)
    assert isinstance(start, budget.AttemptStart)
    # the Initiative's 300 s left bind before the Lane's 480 s and the hour of --executor-timeout
    assert start.limits == ev.AttemptLimits(timeout_seconds=300, tokens=6_000, cost_usd=0.75)
    assert start.wall_detail == ("the attempt reached the Initiative's wall-time budget of 30m (5m were left when "
                                 "it started)")
    unbounded = budget.decide_start(None, Spent(9, 10**9, 10**9, 100.0), Spent(), 3600)
    assert unbounded == budget.AttemptStart(ev.AttemptLimits(timeout_seconds=3600))


def test_a_timeout_shorter_than_what_is_left_stays_a_timeout():
    start = budget.decide_start(BUDGETS, Spent(), Spent(), 60)
    assert start.limits.timeout_seconds == 60 and start.wall_detail is None


@pytest.mark.parametrize("lane, initiative, scope, measure", [
    (Spent(3, 0, 0, 0.0), Spent(3, 0, 0, 0.0), "lane", "attempts"),  # the Lane's is said first
    (Spent(1, 600_000, 0, 0.0), Spent(1, 600_000, 0, 0.0), "lane", "wall"),
    (Spent(1, 0, 10_000, 0.0), Spent(), "lane", "tokens"),
    (Spent(1, 0, 0, 0.0), Spent(5, 0, 0, 2.0), "initiative", "cost"),
    (Spent(1, 0, 0, 0.0), Spent(5, 1_800_000, 0, 0.0), "initiative", "wall"),
])
def test_no_attempt_starts_once_a_budget_is_spent(lane, initiative, scope, measure):
    spent = budget.decide_start(BUDGETS, lane, initiative, 3600)
    assert isinstance(spent, budget.Exhausted) and (spent.scope, spent.measure) == (scope, measure)


def test_a_spent_budget_says_what_ran_out_and_the_option_that_raises_it():
    spent = budget.decide_start(BUDGETS, Spent(3, 0, 0, 0.0), Spent(), 3600)
    assert spent.text() == "the Lane's budget of 3 attempts is spent (3 attempts used)"
    assert spent.raise_text("demo") == (
        "a stopped task does not resume in this batch: to give it more, `lanes-es retire demo`, remove its Lane, "
        "then run demo again with a higher --lane-budget-attempts (e.g. `lanes-es run demo ... "
        "--lane-budget-attempts 5`)")
    dollars = budget.Exhausted("initiative", "cost", 2.0, 2.0312)
    assert dollars.text() == "the Initiative's budget of $2.00 is spent ($2.03 used)"
    assert "`lanes-es run demo ... --initiative-budget-usd 4`" in dollars.raise_text("demo")


def test_running_attempts_end_when_the_initiative_budget_is_spent_counting_no_attempt_twice():
    assert budget.spent_while_running(BUDGETS, Spent(99, 1_000, 0, 1.99)) is None  # attempts counted at start
    spent = budget.spent_while_running(BUDGETS, Spent(2, 1_000, 0, 2.0))
    assert (spent.scope, spent.measure) == ("initiative", "cost")
    assert budget.spent_while_running(None, Spent(9, 10**9, 10**9, 1e6)) is None


def test_an_executor_is_held_only_to_what_it_reports():
    codex = frozenset({"attempts", "wall", "tokens"})
    assert budget.unbounded_by(BUDGETS, codex) == [("initiative", "cost")]
    assert budget.unbounded_by(BUDGETS, frozenset({"attempts"})) == [
        ("lane", "wall"), ("lane", "tokens"), ("initiative", "wall"), ("initiative", "cost")]
    assert budget.unbounded_by(None, frozenset()) == []
    assert [budget.option(scope, measure) for scope, measure in budget.unbounded_by(BUDGETS, codex)] == [
        "--initiative-budget-usd"]


def test_a_budget_stop_is_recorded_once_between_attempts_and_folds_back():
    batch = running_batch()
    record = msgspec.json.encode(batch.record)
    started(batch, "task-a", 1, 3)
    with pytest.raises(TransitionRefused, match="under way"):
        batch.exhaust_executor_budget(at(4), "task-a", "lane", "tokens", 10_000, 12_000, "spent")
    batch.finish_executor_run(at(4), "task-a", 1, 0, 61_000, True, USAGE)
    batch.exhaust_executor_budget(at(5), "task-a", "lane", "attempts", 1, 1, "the Lane's budget of 1 attempt is spent")
    with pytest.raises(TransitionRefused, match="already stopped"):
        batch.exhaust_executor_budget(at(6), "task-a", "lane", "attempts", 1, 1, "again")
    with pytest.raises(TransitionRefused, match="no child task-z"):
        batch.exhaust_executor_budget(at(6), "task-z", "lane", "attempts", 1, 1, "again")
    assert msgspec.json.encode(batch.record) == record  # audit only
    assert batch.executor_runs.exhausted["task-a"].detail == "the Lane's budget of 1 attempt is spent"
    lines = budget_lines(batch.executor_runs, budget.with_values(None, {("lane", "attempts"): 1}), ["task-a", "task-b"])
    assert lines == ["executor budget: per Lane: 1 attempt; for the Initiative (all its Lanes): none",
                     "  task-a: spent 1 attempt, 1m1s, 1200 tokens, $0.1000; left 0 attempts",
                     "  task-b: spent 0 attempts, 0s, 0 tokens, $0.00; left 1 attempt",
                     "  the Initiative (all Lanes): spent 1 attempt, 1m1s, 1200 tokens, $0.1000",
                     "  task-a was stopped: the Lane's budget of 1 attempt is spent"]


def test_what_is_left_never_goes_below_nothing():
    assert budget.left(BUDGETS.lane, Spent(5, 700_000, 1, 0.0)) == {"attempts": 0, "wall": 0, "tokens": 9_999,
                                                                      "cost": None}
    assert account_text(BUDGETS.initiative, Spent(1, 90_000, 0, 0.5)) == (
        "spent 1 attempt, 1m30s, 0 tokens, $0.5000; left 28m30s, $1.50")
