"""The timeline rows and the self-contained audit page built from them."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import msgspec

from tests.unit.audit_logs import at, completed_log, long_log, parked_log, sha
from lanes_es.domain import events as ev
from lanes_es.projections.audit_html import render_audit_html
from lanes_es.projections.timeline import tasks_in_plan_order, timeline


def test_one_row_per_event_with_the_card_transition_names():
    events = completed_log()
    rows = timeline(events)
    assert [row.version for row in rows] == [event.originator_version for event in events]
    integrated = next(row for row in rows if row.event == "Integrated")
    assert integrated.task_id == "task-a" and integrated.transition == "integrated"
    assert integrated.facts == {"commit": sha("batch-task-a"), "adopted": False}
    assert integrated.at == at(12) and integrated.digest == events[integrated.version - 1].digest
    started = rows[1]
    assert (started.event, started.task_id, started.transition, started.facts) == ("BatchStarted", None, None, {})


def test_facts_are_plain_json_values():
    rows = timeline(parked_log())
    admitted = next(row for row in rows if row.event == "LaneAdmitted")
    assert admitted.facts["lane"] == {"path": "/lanes/lane-task-a", "branch": "imm-lane/demo/task-a",
                                      "base_head": "b" * 40}
    parked = next(row for row in rows if row.event == "Parked")
    assert parked.transition == "parked" and parked.facts["skipped"] == ["task-c"]
    msgspec.json.encode(rows)  # every row is encodable as it is


def test_tasks_come_in_plan_order():
    assert tasks_in_plan_order(parked_log()) == ["task-a", "task-b", "task-c"]


# ---------------------------------------------------------------- the page


class _Collector(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):  # noqa: ANN001
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):  # noqa: ANN001
        self.text.append(data)


def _parse(page: str) -> _Collector:
    collector = _Collector()
    collector.feed(page)
    return collector


def test_the_page_loads_nothing_from_anywhere():
    page = render_audit_html("batch-demo-1", parked_log())
    parsed = _parse(page)
    for tag, attrs in parsed.tags:
        assert tag not in ("link", "iframe", "img", "object", "embed"), tag
        assert "src" not in attrs, (tag, attrs)
        href = attrs.get("href")
        assert href is None or href.startswith("#"), (tag, href)
    assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", page)
    assert "@import" not in page and "url(" not in page


def test_untrusted_text_is_escaped():
    events = parked_log()
    hostile = '"><img src=x onerror=alert(1)>'
    index = next(i for i, e in enumerate(events) if isinstance(e, ev.OffersRefused))
    events[index] = msgspec.structs.replace(events[index], refusals=[
        ev.LaneRefusal(task_id="task-c", path=hostile, reason="batch_lane_dirty")])
    page = render_audit_html('batch-<b>"x"', events)
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<img" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    assert "batch-&lt;b&gt;&quot;x&quot;" in page
    assert page.count("<script>") == 1  # the page's own filter, nothing from the log


def test_the_page_shows_lanes_parks_integrations_ticks_and_every_event():
    events = parked_log()
    page = render_audit_html("batch-demo-1", events)
    parsed = _parse(page)
    labels = [attrs["data-task"] for tag, attrs in parsed.tags if attrs.get("class") == "lane-label"]
    assert labels == ["(batch)", "task-a", "task-b", "task-c"]
    text = "".join(parsed.text)
    assert "batch_lane_lost: the claim <script>alert(1)</script> vanished" in text  # the reason, as text
    assert sha("batch-task-a")[:7] in text  # the integrated commit, short
    ticks = [attrs for tag, attrs in parsed.tags if tag == "line" and attrs.get("class") == "tick"]
    assert len(ticks) == len({event.at for event in events})
    event_rows = [attrs["id"] for tag, attrs in parsed.tags if tag == "tr" and (attrs.get("id") or "").startswith("v")]
    assert event_rows == [f"v{event.originator_version}" for event in events]
    marks = [attrs["href"] for tag, attrs in parsed.tags if tag == "a" and attrs.get("class") == "mark"]
    assert "#v10" in marks  # the park links to its row


def test_a_thousand_events_for_thirty_tasks_render_compactly():
    events = long_log(1000)
    page = render_audit_html("batch-demo-1", events)
    parsed = _parse(page)
    labels = [attrs for tag, attrs in parsed.tags if attrs.get("class") == "lane-label"]
    assert len(labels) == 31
    assert sum(1 for tag, attrs in parsed.tags if tag == "tr" and (attrs.get("id") or "").startswith("v")) == 1000
    assert len(page) < 1_500_000
