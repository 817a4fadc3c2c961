"""The adaptive mode's choice per round (pure): batched while Lanes rarely fail, speculative when they do."""

from __future__ import annotations

from lanes_es.domain.adaptive import HISTORY, choose_round, integration_outcomes


def test_no_history_reads_as_rare_failures_and_batches_the_round():
    choice = choose_round(8, [])
    assert (choice.mode, choice.window, choice.considered, choice.failed) == ("batched", 1, 0, 0)
    assert "a batch of 8 passes with probability 0.66" in choice.reason


def test_one_failure_in_the_last_batch_makes_the_next_round_speculative():
    assert choose_round(8, [True] * 7 + [False]).mode == "speculative"


def test_recent_failures_make_the_round_speculative_with_a_window_from_the_failure_rate():
    history = [True] * 10 + [False] * 4  # newest first
    choice = choose_round(8, history)
    assert (choice.mode, choice.considered, choice.failed) == ("speculative", 14, 4)
    assert choice.window == 4  # 1 / ((4 + 0.25) / (14 + 5)) = 4.5 Lanes expected to pass before a failure
    assert choose_round(8, [False] * 20).window == 2  # never below 2
    assert choose_round(3, [True] * 2 + [False] * 2).window == 3  # 1 / 0.25 = 4, at most the round's Lanes


def test_only_the_most_recent_lanes_count():
    old_failures = [True] * HISTORY + [False] * 10
    assert choose_round(8, old_failures).mode == "batched"
    assert choose_round(8, old_failures).considered == HISTORY


def test_a_bigger_round_is_less_likely_to_pass_whole():
    history = [True] * 30
    assert choose_round(8, history).mode == "batched"
    assert choose_round(100, history).mode == "speculative"


def test_outcomes_count_only_children_that_reached_integration_newest_first():
    record = {"children": [
        {"task_id": "a", "state": "integrated", "reason": None},
        {"task_id": "b", "state": "needs_human", "reason": "batch_integration_check_failed: b:A1 failed on x"},
        {"task_id": "c", "state": "needs_human", "reason": "dirty_outside_scope: README.md outside the scope of c"},
        {"task_id": "d", "state": "released", "reason": None},
        {"task_id": "e", "state": "needs_human", "reason": "batch_integration_conflict: lane commit does not apply"},
        {"task_id": "f", "state": "enrolled", "reason": None},
    ]}
    assert integration_outcomes(record) == [False, True, False, True]


def test_the_store_history_reads_the_initiatives_earlier_batches_newest_first():
    from types import SimpleNamespace

    from lanes_es.adapters.integration_history import StoreHistory

    def batch(*states: tuple[str, str | None]) -> SimpleNamespace:
        return SimpleNamespace(record={"children": [{"state": state, "reason": reason} for state, reason in states]})

    failed = ("needs_human", "batch_integration_check_failed: x")
    batches = {"old": batch(("integrated", None), failed), "empty": batch(("needs_human", "dirty_outside_scope: x")),
               "newer": batch(("released", None)), "current": batch(failed)}

    class Store:
        def initiative(self, slug: str) -> SimpleNamespace:
            assert slug == "slug"
            return SimpleNamespace(batch_ids=lambda: ["old", "empty", "newer", "current"])

        def batch(self, batch_id: str) -> SimpleNamespace:
            return batches[batch_id]

    outcomes, read = StoreHistory(Store()).earlier_outcomes("slug", "current")
    assert (outcomes, read) == ([True, False, True], ["newer", "old"])  # the current batch is the tick's own
