"""The flake policy's rule: only a check that existed, unchanged, before the Lane may run again."""

from __future__ import annotations

from lanes_es.domain.flakes import rerunnable


def intent(**items: str) -> dict:
    return {"acceptance": [{"id": item_id, "verification": text} for item_id, text in items.items()]}


def test_an_unchanged_check_from_before_the_lane_may_run_again():
    assert rerunnable(["t:A1"], "t", intent(A1="run"), intent(A1="run", A2="new"))


def test_a_check_the_lane_added_or_changed_never_runs_again():
    assert not rerunnable(["t:A2"], "t", intent(A1="run"), intent(A1="run", A2="new"))  # added
    assert not rerunnable(["t:A1"], "t", intent(A1="run"), intent(A1="changed"))       # changed
    assert not rerunnable(["t:A1", "t:A2"], "t", intent(A1="run"), intent(A1="run", A2="new"))  # one of them added
    assert not rerunnable(["t:A1"], "t", None, intent(A1="run"))                        # no intent at the base


def test_nothing_failed_nothing_to_rerun():
    assert not rerunnable([], "t", intent(A1="run"), intent(A1="run"))
