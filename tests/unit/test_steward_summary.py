"""The autopilot's end summary agrees with its own count of released Lanes."""

from types import SimpleNamespace

from lanes_es.steward.summary import summary_lines


def _autopilot(released):
    return SimpleNamespace(released=released, kept={}, steward_refusals={}, refused={},
                           executors=SimpleNamespace(finished={}), steward=None, deps=SimpleNamespace(checkout=None))


def _report(states):
    return {"batch_id": "batch-demo-1", "batch_state": "completed", "reason": None, "initiative_slug": "demo",
            "commits": ["c"] * len(states), "handoffs": [],
            "children": [{"task_id": task_id, "state": state, "commit": None, "reason": None, "lane": None}
                         for task_id, state in states.items()]}


def test_a_lane_released_after_the_last_tick_is_shown_released_not_only_integrated():
    """The batch settles on the tick that integrates the last Lane; the steward removes that Lane
    afterwards, so the report still says `integrated` while the count says every Lane was released."""
    lines = summary_lines(_autopilot(["a", "b"]), _report({"a": "released", "b": "integrated"}), None)
    rows = {line.split()[0]: line for line in lines if line.startswith("  ")}
    assert rows["b"].split(None, 1)[1] == "integrated, its Lane released by the steward after the last tick"
    assert rows["a"].split(None, 1)[1] == "released"
    assert "2 Lanes released by the steward" in "\n".join(lines)


def test_an_integrated_lane_the_steward_did_not_release_stays_integrated():
    lines = summary_lines(_autopilot([]), _report({"b": "integrated"}), None)
    assert [line.split()[1] for line in lines if line.startswith("  ")] == ["integrated"]
