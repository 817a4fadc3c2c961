"""The audit page: one self-contained HTML file showing what happened to a batch, and when.

- a swimlane timeline: a lane per task (and one for the batch), its state as a coloured
  band over time and a marker at each event, the event index as the x axis (a tick's
  events share one `at`, so time alone would stack them), tick boundaries where `at`
  changes, labelled with the time;
- parks with their reasons, integrations with their commits;
- a table of every event, linked from the markers, with a filter box.

Pure and self-contained: inline CSS, SVG and a few lines of JS; nothing is loaded from
anywhere. Every piece of text from the log (task ids, reasons, paths) is escaped.
"""

from __future__ import annotations

import json
from html import escape
from typing import Any, Sequence

from lanes_es.domain import events as ev
from lanes_es.domain.record import apply_event, prepared_record

from .failures import failure_lines
from .timeline import AnchorMarks, TimelineRow, tasks_in_plan_order, timeline

LABEL_WIDTH = 190
LANE_HEIGHT = 30
BAND_TOP, BAND_HEIGHT = 4, 10  # a lane's state band, from the lane's top
MARKER_MIDDLE = 9  # the markers sit on the band
LABEL_BASELINE = 26  # an integration's commit, under its marker
AXIS_HEIGHT = 34
BATCH_LANE = "(batch)"
MIN_LABEL_GAP = 70  # px between two time labels on the axis
LABEL_CHAR_WIDTH = 7  # px per character of the 11px monospace axis labels

# Colour of each child state's band, and of each marker (the legend shows both).
STATE_COLOURS = {
    "lane_admitted": "#c9d3df",
    "enrolled": "#8fb8e8",
    "settled": "#7fd0c8",
    "lane_committed": "#b9a3e3",
    "integrated": "#7cc47f",
    "released": "#b5dcb0",
    "needs_human": "#f08c8c",
    "skipped_blocked": "#f5c07a",
}
MARKER_COLOURS = {
    "lane_admitted": "#5b6b80",
    "enrolled": "#1f64b5",
    "settled": "#138a7e",
    "lane_committed": "#6a41b8",
    "integrated": "#1d7a24",
    "released": "#4f8f47",
    "parked": "#c62828",
    "resealed": "#a35f00",
}
OTHER_MARKER = "#777777"


def _text(value: Any) -> str:
    """Every piece of text on its way into the page, log text or not."""
    return escape(str(value), quote=True)


def render_audit_html(batch_id: str, events: Sequence[Any], anchors: AnchorMarks | None = None) -> str:
    anchors = anchors or AnchorMarks()
    rows = timeline(events)
    tasks = tasks_in_plan_order(events)
    record, bands = _fold_bands(events)
    parts = [
        _head(batch_id),
        _summary(batch_id, record, rows),
        _legend(),
        '<section><h2>Timeline</h2>',
        '<p class="hint">One lane per task; the x axis is the event index, dashed lines are tick boundaries '
        '(a change of time). Hover a marker for its facts; click it to jump to the event.</p>',
        _swimlanes(rows, tasks, bands),
        '</section>',
        _parks(rows),
        _integrations(rows, anchors),
        _checkpoints(rows, anchors),
        _children(record),
        _attempts(events),
        _event_table(rows, anchors),
        _SCRIPT,
        "</body></html>\n",
    ]
    return "\n".join(parts)


# ---------------------------------------------------------------- folding the states


def _fold_bands(events: Sequence[Any]) -> tuple[dict[str, Any] | None, dict[str, list[tuple[int, str]]]]:
    """The final record, and for each task the (event index, state) where its state changed."""
    record: dict[str, Any] | None = None
    bands: dict[str, list[tuple[int, str]]] = {}
    for index, event in enumerate(events):
        try:
            if isinstance(event, ev.BatchPrepared):
                record = prepared_record(event)
            elif record is not None:
                apply_event(record, event)
        except (KeyError, TypeError, ValueError):
            continue  # a log that does not fold is still shown; `verify` names what is wrong with it
        if record is None:
            continue
        for child in record["children"]:
            changes = bands.setdefault(child["task_id"], [])
            if not changes or changes[-1][1] != child["state"]:
                changes.append((index, child["state"]))
    return record, bands


# ---------------------------------------------------------------- page parts


def _head(batch_id: str) -> str:
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        f"<title>Audit of {_text(batch_id)}</title><style>{_CSS}</style></head><body>"
    )


def _summary(batch_id: str, record: dict[str, Any] | None, rows: list[TimelineRow]) -> str:
    state = record["batch_state"] if record else "unknown"
    facts = [
        ("Initiative", record["initiative_slug"] if record else "-"),
        ("Batch state", state),
        ("Branch", record.get("branch", "-") if record else "-"),
        ("Base head", record["base_head"][:12] if record else "-"),
        ("Integration", _integration_of(rows)),
        ("Events", str(len(rows))),
        ("Ticks", str(len({row.at for row in rows}))),
        ("From", rows[0].at if rows else "-"),
        ("To", rows[-1].at if rows else "-"),
        ("Chain head", rows[-1].digest if rows else "-"),
    ]
    items = "".join(f"<div><dt>{_text(name)}</dt><dd>{_text(value)}</dd></div>" for name, value in facts)
    return (f"<header><h1>Audit of <span class=\"mono\">{_text(batch_id)}</span> "
            f"<span class=\"state state-{_text(state)}\">{_text(state)}</span></h1><dl class=\"facts\">{items}</dl>"
            "<label class=\"filter\">Filter <input id=\"filter\" type=\"search\" "
            "placeholder=\"task, event, reason, commit…\" autocomplete=\"off\"></label></header>")


def _integration_of(rows: list[TimelineRow]) -> str:
    """The integration mode the batch was prepared with (serial in logs from before the choice), and its
    candidate verifications."""
    prepared = next((row for row in rows if row.event == "BatchPrepared"), None)
    if prepared is None:
        return "-"
    mode = prepared.facts.get("integration") or "serial"
    verdicts = [row for row in rows if row.event == "CandidateVerified"]
    if not verdicts:
        return mode
    failed = sum(1 for row in verdicts if not row.facts.get("passed"))
    flaky = sorted({finding for row in verdicts for check in row.facts.get("checks", [])
                    for finding in check.get("flaky", [])})
    text = f"{mode}: {len(verdicts)} candidates verified, {failed} failed"
    return text + (f"; passed only on a rerun: {', '.join(flaky)}" if flaky else "")


def _legend() -> str:
    bands = "".join(
        f"<span><i class=\"band\" style=\"background:{colour}\"></i>{_text(state)}</span>"
        for state, colour in STATE_COLOURS.items())
    markers = "".join(
        f"<span><i class=\"dot\" style=\"background:{colour}\"></i>{_text(name)}</span>"
        for name, colour in MARKER_COLOURS.items())
    return ("<section class=\"legend\" aria-label=\"Legend\"><div><b>States</b>" + bands + "</div>"
            "<div><b>Events</b>" + markers
            + f"<span><i class=\"dot diamond\" style=\"background:{OTHER_MARKER}\"></i>other event</span>"
            "<span><i class=\"tickline\"></i>tick boundary</span></div></section>")


def _step_width(count: int) -> float:
    """Pixels per event at the timeline's narrowest (a long log scrolls); it widens to fill the page."""
    return max(3.0, min(14.0, 24000.0 / max(count, 1)))


class _Axis:
    """Where event `index` sits: a percentage of the timeline's width, so the timeline fills the page (an SVG
    with a fixed width used a fifth of it for a short log), and its narrowest width in pixels, at which the
    labels are thinned so that they never overlap (wider, they only move apart)."""

    def __init__(self, count: int) -> None:
        self.count = max(count, 1)
        self.step = _step_width(count)
        self.min_width = int(self.step * (self.count + 1))

    def at(self, index: float) -> str:
        return f"{(index + 0.5) / (self.count + 1) * 100:.3f}%"

    def pixels(self, index: float) -> float:
        """`index`'s place at the narrowest width, for spacing labels."""
        return self.step * (index + 0.5)


def _swimlanes(rows: list[TimelineRow], tasks: list[str], bands: dict[str, list[tuple[int, str]]]) -> str:
    axis = _Axis(len(rows))
    lanes = [BATCH_LANE, *tasks]
    lane_of = {task: index for index, task in enumerate(lanes)}
    height = AXIS_HEIGHT + LANE_HEIGHT * len(lanes)
    svg: list[str] = [f"<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"100%\" height=\"{height}\" "
                      f"style=\"min-width:{axis.min_width}px\" role=\"img\" aria-label=\"Swimlane timeline\">"]
    for position in range(len(lanes)):
        top = AXIS_HEIGHT + position * LANE_HEIGHT
        shade = "lane-even" if position % 2 == 0 else "lane-odd"
        svg.append(f"<rect class=\"{shade}\" x=\"0\" y=\"{top}\" width=\"100%\" height=\"{LANE_HEIGHT}\"/>")
    svg.extend(_tick_lines(rows, axis, height))
    for task, changes in bands.items():
        svg.extend(_bands_of(lane_of.get(task), changes, axis, len(rows)))
    for index, row in enumerate(rows):
        svg.extend(_markers_of(row, index, lane_of, axis))
    svg.append("</svg>")
    labels = "".join(
        f"<div class=\"lane-label\" data-task=\"{_text(task)}\" title=\"{_text(task)}\">{_text(task)}</div>"
        for task in lanes)
    return (f"<div class=\"swim\" style=\"--lane:{LANE_HEIGHT}px;--axis:{AXIS_HEIGHT}px\">"
            f"<div class=\"labels\" style=\"width:{LABEL_WIDTH}px\"><div class=\"axis-label\">time ▸</div>{labels}</div>"
            f"<div class=\"lanes\">{''.join(svg)}</div></div>")


def _tick_lines(rows: list[TimelineRow], axis: _Axis, height: int) -> list[str]:
    out: list[str] = []
    previous_at = None
    free_from = float("-inf")  # where the axis has room for the next label, at the narrowest width
    last_day = ""
    for index, row in enumerate(rows):
        if row.at == previous_at:
            continue
        previous_at = row.at
        left = axis.at(index - 0.5)
        out.append(f"<line class=\"tick\" x1=\"{left}\" y1=\"{AXIS_HEIGHT - 6}\" x2=\"{left}\" y2=\"{height}\">"
                   f"<title>tick at {_text(row.at)}</title></line>")
        # The date only where it changes; a tick's time of day otherwise.
        shown = row.at[11:19] if row.at[:10] == last_day else f"{row.at[5:10]} {row.at[11:19]}"
        here = axis.pixels(index - 0.5)
        if here >= free_from:
            free_from = here + max(MIN_LABEL_GAP, len(shown) * LABEL_CHAR_WIDTH + 10)
            last_day = row.at[:10]
            out.append(f"<text class=\"time\" x=\"{left}\" dx=\"2\" y=\"12\">{_text(shown)}</text>"
                       f"<text class=\"index\" x=\"{left}\" dx=\"2\" y=\"24\">#{row.version}</text>")
    return out


def _bands_of(lane: int | None, changes: list[tuple[int, str]], axis: _Axis, count: int) -> list[str]:
    if lane is None:
        return []
    top = AXIS_HEIGHT + lane * LANE_HEIGHT + BAND_TOP
    out: list[str] = []
    for position, (index, state) in enumerate(changes):
        colour = STATE_COLOURS.get(state)
        if colour is None:  # pending: no band
            continue
        end = changes[position + 1][0] if position + 1 < len(changes) else count
        width = f"{max(end - index, 0.3) / (axis.count + 1) * 100:.3f}%"
        out.append(f"<rect x=\"{axis.at(index)}\" y=\"{top}\" width=\"{width}\" height=\"{BAND_HEIGHT}\" rx=\"3\" "
                   f"fill=\"{colour}\"/>")
    return out


def _markers_of(row: TimelineRow, index: int, lane_of: dict[str, int], axis: _Axis) -> list[str]:
    task = row.task_id if row.task_id in lane_of else BATCH_LANE
    top = AXIS_HEIGHT + lane_of[task] * LANE_HEIGHT
    out = [_marker(row, axis.at(index), top + MARKER_MIDDLE, task)]
    if row.event == "Integrated":
        # under its marker, in the lane's own label line: a lane holds one integration, so no two labels meet
        out.append(f"<text class=\"sha\" x=\"{axis.at(index)}\" y=\"{top + LABEL_BASELINE}\" "
                   f"text-anchor=\"middle\">{_text(str(row.facts.get('commit', ''))[:7])}</text>")
    if row.event == "Parked":
        for skipped in row.facts.get("skipped", []):
            if skipped in lane_of:
                lower = AXIS_HEIGHT + lane_of[skipped] * LANE_HEIGHT + MARKER_MIDDLE
                out.append(_marker(row, axis.at(index), lower, skipped, colour=STATE_COLOURS["skipped_blocked"]))
    return out


def _marker(row: TimelineRow, cx: str, cy: float, task: str, colour: str | None = None) -> str:
    title = _text(f"#{row.version} {row.at} {row.event}" + (f" {row.task_id}" if row.task_id else "")
                  + "\n" + _facts_text(row.facts, limit=600))
    if row.transition is not None or colour is not None:
        fill = colour or MARKER_COLOURS[row.transition]
        shape = f"<circle r=\"4.5\" fill=\"{fill}\"/>"
    else:
        shape = f"<rect x=\"-3\" y=\"-3\" width=\"6\" height=\"6\" fill=\"{OTHER_MARKER}\" transform=\"rotate(45)\"/>"
    # an inner svg placed at the event's share of the width; the shape in pixels around its origin
    return (f"<a href=\"#v{row.version}\" class=\"mark\" data-task=\"{_text(task)}\">"
            f"<title>{title}</title><svg x=\"{cx}\" y=\"{cy}\" overflow=\"visible\">{shape}</svg></a>")


def _facts_text(facts: dict[str, Any], limit: int = 0) -> str:
    parts = []
    for name, value in facts.items():
        shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        parts.append(f"{name}={shown}")
    text = "  ".join(parts)
    return text[:limit] + "…" if limit and len(text) > limit else text


def _parks(rows: list[TimelineRow]) -> str:
    parks = [row for row in rows if row.event == "Parked"]
    if not parks:
        return "<section><h2>Parks</h2><p class=\"hint\">No child was parked.</p></section>"
    items = "".join(
        f"<li><a href=\"#v{row.version}\">#{row.version}</a> <span class=\"mono\">{_text(row.at)}</span> "
        f"<b>{_text(row.task_id)}</b>: {_text(row.facts.get('reason', ''))}"
        + (f" <span class=\"hint\">(skipped: {_text(', '.join(row.facts.get('skipped', [])))})</span>"
           if row.facts.get("skipped") else "")
        + _why(row.facts) + "</li>" for row in parks)
    return f"<section><h2>Parks</h2><ul class=\"parks\">{items}</ul></section>"


def _why(facts: dict[str, Any]) -> str:
    """A park's failed checks: each command's reason and times, and its output's tail, as `status` shows them."""
    lines = failure_lines(facts)
    return f"<pre class=\"why\">{_text(chr(10).join(lines))}</pre>" if lines else ""


def _integrations(rows: list[TimelineRow], anchors: AnchorMarks) -> str:
    done = [row for row in rows if row.event == "Integrated"]
    if not done:
        return "<section><h2>Integrations</h2><p class=\"hint\">Nothing was integrated.</p></section>"
    items = "".join(
        f"<li><a href=\"#v{row.version}\">#{row.version}</a> <span class=\"mono\">{_text(row.at)}</span> "
        f"<b>{_text(row.task_id)}</b> <span class=\"mono\" title=\"{_text(row.facts.get('commit', ''))}\">"
        f"{_text(str(row.facts.get('commit', ''))[:12])}</span>"
        + (" <span class=\"hint\">(adopted)</span>" if row.facts.get("adopted") else "")
        + (f" <span class=\"attested\" title=\"{_text(anchors.attested[row.version])}\">attested</span>"
           if row.version in anchors.attested else "") + "</li>"
        for row in done)
    return f"<section><h2>Integrations</h2><ol class=\"integrations\">{items}</ol></section>"


def _checkpoints(rows: list[TimelineRow], anchors: AnchorMarks) -> str:
    """The signed checkpoints on the batch's ref (refs/lanes-es/checkpoints/<batch>), oldest first."""
    if not anchors.checkpoints:
        return ("<section><h2>Checkpoints</h2><p class=\"hint\">No signed checkpoint on the batch's ref: the end "
                "of this log is not anchored outside the store.</p></section>")
    at = {row.version: row.at for row in rows}
    items = "".join(
        f"<li><a href=\"#v{size}\">#{size}</a> <span class=\"mono\">{_text(at.get(size, ''))}</span> "
        f"{size} events, root <span class=\"mono\" title=\"{_text(root)}\">{_text(root[:16])}</span></li>"
        for size, root in anchors.checkpoints)
    newest = anchors.checkpoints[-1][0]
    behind = (f" <span class=\"hint\">The newest covers {newest} of {len(rows)} events.</span>"
              if newest != len(rows) else "")
    return (f"<section><h2>Checkpoints</h2><p class=\"hint\">Signed tree heads of this log, kept in git; "
            f"<code>lanes-es verify</code> checks them.{behind}</p><ol class=\"checkpoints\">{items}</ol></section>")


def _children(record: dict[str, Any] | None) -> str:
    if not record:
        return ""
    body = "".join(
        f"<tr data-task=\"{_text(child['task_id'])}\"><td class=\"mono\">{_text(child['task_id'])}</td>"
        f"<td><span class=\"state state-{_text(child['state'])}\">{_text(child['state'])}</span></td>"
        f"<td class=\"mono\">{_text((child['commit'] or '')[:12])}</td>"
        f"<td class=\"mono\">{_text(((child.get('lane') or {}).get('run_id')) or '')}</td>"
        f"<td>{_text(child['reason'] or '')}</td></tr>"
        for child in record["children"])
    return ("<section><h2>Children</h2><div class=\"scroll short\"><table class=\"grid\" id=\"children\"><thead><tr><th>task</th>"
            "<th>state</th><th>commit</th><th>run</th><th>reason</th></tr></thead>"
            f"<tbody>{body}</tbody></table></div></section>")


def _attempts(events: Sequence[Any]) -> str:
    """Every Executor attempt: who ran, what for, how it ended and what it reported of itself."""
    from lanes_es.domain.executor_runs import ExecutorRuns

    runs = ExecutorRuns()
    for event in events:
        runs.fold(event)
    if not runs.attempts:
        return ("<section><h2>Executor attempts</h2><p class=\"hint\">No Executor attempt was recorded (the "
                "Executors ran outside <code>lanes-es run</code>).</p></section>")
    body = "".join(_attempt_row(attempt) for attempts in runs.attempts.values() for attempt in attempts)
    # A task whose next attempt would have started over a budget: stopped, with which budget and how to raise it.
    stops = "".join(f"<li><a href=\"#v{event.originator_version}\">{_text(task_id)}</a> was stopped for its "
                    f"Executor budget: {_text(event.detail)}</li>" for task_id, event in runs.exhausted.items())
    return ("<section><h2>Executor attempts</h2><div class=\"scroll short\"><table class=\"grid\" id=\"attempts\">"
            "<thead><tr><th>task</th><th>#</th><th>adapter</th><th>for</th><th>started</th><th>ended</th>"
            "<th>seconds</th><th>tokens in / out</th><th>cost</th><th>denied</th><th>session</th></tr></thead>"
            f"<tbody>{body}</tbody></table></div>" + (f"<ul id=\"budget-stops\">{stops}</ul>" if stops else "")
            + "</section>")


def _attempt_row(attempt: Any) -> str:
    started, ended, usage = attempt.started, attempt.ended, attempt.usage
    if ended is None:
        outcome = "under way"
    elif type(ended) is ev.ExecutorRunKilled:
        outcome = f"killed: {ended.reason}: {ended.detail}"
    else:
        outcome = f"exit {ended.exit_code}" + ("" if ended.submitted is None else
                                               ", submitted" if ended.submitted else ", not submitted")
    if usage.agent_error:
        outcome += f"; agent error: {usage.error}"
    tokens = ("" if usage.tokens_in is None and usage.tokens_out is None
              else f"{usage.tokens_in or 0} / {usage.tokens_out or 0}")
    cells = [f"<a href=\"#v{started.originator_version}\">{_text(started.task_id)}</a>", str(started.attempt),
             _text(started.adapter), _text(started.obligation), _text(started.at), _text(outcome),
             "" if ended is None or ended.duration_ms is None else f"{ended.duration_ms / 1000:.1f}", tokens,
             "" if usage.cost_usd is None else f"${usage.cost_usd:.4f}",
             _text(", ".join(usage.denied_tools or [])), _text(usage.session_id or "")]
    return "<tr>" + "".join(f"<td class=\"mono\">{cell}</td>" for cell in cells) + "</tr>"


def _event_table(rows: list[TimelineRow], anchors: AnchorMarks) -> str:
    body = "".join(_event_row(row, previous, anchors) for row, previous in zip(rows, [None, *rows]))
    return ("<section><h2>Events <span class=\"hint\" id=\"shown\"></span></h2><div class=\"scroll\">"
            "<table class=\"grid events\" id=\"events\"><thead><tr><th>#</th><th>at</th><th>event</th><th>task</th>"
            "<th>transition</th><th>facts</th><th>digest</th></tr></thead>"
            f"<tbody>{body}</tbody></table></div></section>")


def _event_row(row: TimelineRow, previous: TimelineRow | None, anchors: AnchorMarks) -> str:
    boundary = " class=\"tick-start\"" if previous is None or previous.at != row.at else ""
    transition = (f"<span class=\"tr\" style=\"border-color:{MARKER_COLOURS[row.transition]}\">"
                  f"{_text(row.transition)}</span>") if row.transition else ""
    return (f"<tr id=\"v{row.version}\"{boundary} data-task=\"{_text(row.task_id or '')}\">"
            f"<td class=\"num\">{row.version}</td><td class=\"mono\">{_text(row.at)}</td>"
            f"<td>{_text(row.event)}</td><td class=\"mono\">{_text(row.task_id or '')}</td><td>{transition}</td>"
            f"<td class=\"facts\">{_text(_facts_text(row.facts))}{_anchor_badges(row, anchors)}</td>"
            f"<td class=\"mono\" title=\"{_text(row.digest)}\">{_text(row.digest[:10])}</td></tr>")


def _anchor_badges(row: TimelineRow, anchors: AnchorMarks) -> str:
    badges = ""
    if row.version in anchors.attested:
        badges += f" <span class=\"attested\" title=\"{_text(anchors.attested[row.version])}\">attested</span>"
    for root in anchors.checkpoint_at(row.version):
        badges += f" <span class=\"checkpointed\" title=\"root {_text(root)}\">checkpoint {row.version}</span>"
    return badges


# ---------------------------------------------------------------- inline style and behaviour


_CSS = """
:root{--fg:#1d232b;--muted:#5d6875;--line:#d9dee5;--bg:#ffffff;--soft:#f5f7fa;font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);background:var(--bg)}
body{margin:0;padding:0 18px 40px;font-size:14px}
header{position:sticky;top:0;z-index:5;background:var(--bg);border-bottom:1px solid var(--line);padding:10px 0 8px}
h1{font-size:19px;margin:0 0 6px}h2{font-size:16px;margin:22px 0 8px}
.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12.5px}
.facts{display:flex;flex-wrap:wrap;gap:4px 18px;margin:0}.facts div{display:flex;gap:6px}
.facts dt{color:var(--muted)}.facts dd{margin:0;font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12.5px;max-width:34em;overflow:hidden;text-overflow:ellipsis;white-space:nowrap}
.filter{display:inline-block;margin-top:8px;color:var(--muted)}.filter input{width:26em;padding:4px 8px;font:inherit;border:1px solid #b8c1cc;border-radius:4px}
.hint{color:var(--muted);font-size:12.5px;font-weight:normal}
.state{display:inline-block;padding:0 7px;border-radius:9px;font-size:12px;background:#e3e8ee;font-weight:600}
.state-completed,.state-integrated,.state-released{background:#d5efd6}.state-needs_human,.state-failed{background:#fbd5d5}
.state-budget_stopped,.state-skipped_blocked{background:#fde7c4}.state-running,.state-enrolled{background:#d6e6f8}
.legend{display:flex;flex-direction:column;gap:4px;margin-top:12px;font-size:12.5px}.legend div{display:flex;flex-wrap:wrap;gap:4px 14px;align-items:center}
.legend b{min-width:4.5em}.legend span{display:inline-flex;align-items:center;gap:5px}
.band{display:inline-block;width:22px;height:10px;border-radius:3px}.dot{display:inline-block;width:10px;height:10px;border-radius:50%}
.dot.diamond{border-radius:1px;transform:rotate(45deg);width:8px;height:8px}
.tickline{display:inline-block;width:0;height:12px;border-left:1.5px dashed #8a96a3}
.swim{display:flex;border:1px solid var(--line);border-radius:6px;max-height:72vh;overflow:auto;position:relative}
.labels{position:sticky;left:0;z-index:3;background:var(--bg);border-right:1px solid var(--line);flex:none;height:max-content}
.axis-label{height:var(--axis);box-sizing:border-box;padding:10px 8px 0;color:var(--muted);font-size:12px;position:sticky;top:0;background:var(--bg);z-index:4}
.lane-label{height:var(--lane);line-height:var(--lane);padding:0 8px;font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
.lane-label:nth-of-type(even){background:var(--soft)}
.lanes{flex:1 1 auto;min-width:0;padding-right:36px}.lanes svg{display:block;overflow:visible}
.lane-even{fill:#ffffff}.lane-odd{fill:#f5f7fa}
.tick{stroke:#a3adb8;stroke-width:1;stroke-dasharray:3 3}
.attested,.checkpointed{display:inline-block;font-size:11px;padding:0 5px;border-radius:8px;border:1px solid #3a7d44;color:#3a7d44;margin-left:4px}
.checkpointed{border-color:#5b4a9e;color:#5b4a9e}
.time{font-size:11px;fill:#3b4550;font-family:ui-monospace,Menlo,Consolas,monospace}.index{font-size:10px;fill:#8a96a3}
.sha{font-size:10px;fill:#135a18;font-family:ui-monospace,Menlo,Consolas,monospace;paint-order:stroke;stroke:#fff;stroke-width:3px}
.mark{cursor:pointer}.mark:hover circle,.mark:hover rect{stroke:#000;stroke-width:1.5}
.dim{opacity:.18}
ul.parks li,ol.integrations li{margin:2px 0}
pre.why{white-space:pre-wrap;font-size:12px;margin:4px 0 6px 16px;padding:4px 8px;background:#f6f6f6}
.scroll{max-height:70vh;overflow:auto;border:1px solid var(--line);border-radius:6px}.scroll.short{max-height:40vh}
table.grid{border-collapse:collapse;width:100%;font-size:12.5px}
table.grid th{position:sticky;top:0;z-index:2;background:#eef1f5;text-align:left;padding:4px 8px;border-bottom:1px solid var(--line);white-space:nowrap}
table.grid td{padding:2px 8px;border-bottom:1px solid #eef0f3;vertical-align:top}
table.grid td.mono{white-space:nowrap}
table.grid tbody tr:nth-child(even){background:#fafbfc}
tr.tick-start td{border-top:1.5px solid #b8c1cc}
td.num{text-align:right;color:var(--muted)}td.facts{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px;word-break:break-word}
.tr{border-left:4px solid;padding-left:5px}
tr:target{background:#fff4bf !important}
"""

# Behaviour: the filter hides non-matching event rows and dims lanes of other tasks.
# It reads only the page's own text; nothing from the log is placed inside a script.
_SCRIPT = """<script>
(function () {
  var input = document.getElementById('filter');
  var rows = Array.prototype.slice.call(document.querySelectorAll('#events tbody tr'));
  var tasked = Array.prototype.slice.call(document.querySelectorAll('.lane-label, .mark, #children tr[data-task]'));
  var shown = document.getElementById('shown');
  function taskOf(node) { return (node.getAttribute('data-task') || '').toLowerCase(); }
  function apply() {
    var query = input.value.trim().toLowerCase();
    var count = 0;
    rows.forEach(function (row) {
      var hit = !query || row.textContent.toLowerCase().indexOf(query) !== -1;
      row.style.display = hit ? '' : 'none';
      if (hit) { count += 1; }
    });
    // Lanes dim only when the query names a task; a query for an event or a reason leaves them be.
    var namesTask = query && tasked.some(function (node) { return taskOf(node).indexOf(query) !== -1; });
    tasked.forEach(function (node) {
      node.classList.toggle('dim', Boolean(namesTask && taskOf(node).indexOf(query) === -1));
    });
    shown.textContent = query ? '(' + count + ' of ' + rows.length + ' shown)' : '(' + rows.length + ')';
  }
  input.addEventListener('input', apply);
  apply();
})();
</script>"""
