"""The autopilot's news is driven by the log: any kind of event shows up, each once, in order."""

from __future__ import annotations

import threading

import msgspec

from lanes_es.steward.feed import BatchFeed, describe, event_item, subjects, words


class SomeKindNobodyKnowsYet(msgspec.Struct, frozen=True, kw_only=True):
    """An event kind the display has never heard of (as a candidate event was, before it existed)."""

    originator_id: str
    originator_version: int
    at: str
    lanes: list[str]
    mode: str
    passed: bool
    commit: str
    checks: list[dict[str, str]]  # a record: not for one line


class Enrolled(msgspec.Struct, frozen=True, kw_only=True):
    originator_id: str
    originator_version: int
    task_id: str
    run_id: str


def test_a_kind_the_display_never_heard_of_is_told_by_its_name_and_short_fields():
    event = SomeKindNobodyKnowsYet(originator_id="b", originator_version=7, at="2026-01-01T00:00:00.000Z",
                                   lanes=["one", "two"], mode="speculative", passed=True, commit="ab" * 20,
                                   checks=[{"task_id": "one"}])
    item = event_item("b", event)
    assert item["kind"] == "event" and item["version"] == 7 and item["type"] == "SomeKindNobodyKnowsYet"
    assert item["fields"]["checks"] == [{"task_id": "one"}]  # --json carries every field
    assert subjects(item) == ["one", "two"]
    assert item["text"] == "one+two: some kind nobody knows yet mode=speculative passed=yes commit=abababababab"


def test_an_event_about_one_task_names_it_first():
    item = event_item("b", Enrolled(originator_id="b", originator_version=3, task_id="one", run_id="run-1"))
    assert subjects(item) == ["one"]
    assert describe(item) == "one: enrolled run_id=run-1"
    assert words("LaneCommitted") == "lane committed" and words("TrackerClosed") == "tracker closed"


class Log:
    """A store's batch log that grows while it is read."""

    def __init__(self) -> None:
        self.events: list[Enrolled] = []

    def append(self, count: int) -> None:
        start = len(self.events)
        self.events += [Enrolled(originator_id="b", originator_version=start + n + 1, task_id=f"t{start + n}",
                                 run_id="r") for n in range(count)]

    def events_after(self, aggregate_id: str, version: int) -> list[Enrolled]:
        assert aggregate_id == "b"
        return self.events[version:]


def test_two_readers_tell_every_event_once_in_log_order():
    log, told = Log(), []
    feed = BatchFeed(log)
    assert feed.drain(told.append) == 0  # no batch followed yet
    feed.follow("b")
    readers = []
    for _ in range(50):
        log.append(3)
        readers = [threading.Thread(target=feed.drain, args=(told.append,)) for _ in range(2)]
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join()
    assert [item["version"] for item in told] == list(range(1, 151))
    feed.follow("b")  # the same batch again: nothing is told twice
    assert feed.drain(told.append) == 0
    feed.follow("c-after-b")
    assert feed.version == 0


def test_plain_lines_say_who_works_while_nothing_else_happens():
    from lanes_es.steward.progress import Board, LineProgress, Row

    now = [100.0]
    lines: list[str] = []
    progress = LineProgress(lines.append, clock=lambda: now[0], quiet=30.0)
    board = Board("batch-x", "running", 1, 0, 2, [Row("greet", "enrolled", 100.0, "Executor working (pid 7)"),
                                                   Row("cli", "pending", 100.0)])
    now[0] = 120.0
    progress.show(board)
    assert lines == []  # not quiet for long yet
    now[0] = 131.0
    progress.show(board)
    assert lines == ["[  31.0s] still working: 0/2 done; greet enrolled (Executor working (pid 7)) for 31s"]
    progress.tell({"kind": "note", "text": "news"})
    now[0] = 140.0
    progress.show(board)
    assert lines[-1] == "news"  # a line was told since: the quiet starts again


def test_a_park_on_failed_checks_is_told_with_each_failed_commands_reason_and_output_tail():
    """What the run's lines and live board show under a park: why the check failed, when, and its last lines."""
    from datetime import datetime, timezone

    from lanes_es.domain import events as ev
    from lanes_es.steward.progress import LineProgress

    failed = ev.CheckVerdict(task_id="b", passed=False, findings=["b:A1"], outputs=[ev.CommandDigest(
        id="b:A1", passed=False, output_sha256="ab" * 32, output_bytes=40, reason="python3 exited with code 3",
        output_tail="\n".join(f"line {n}" for n in range(20)), started_at="2026-01-01T00:00:01.000Z",
        duration_ms=1234)])
    parked = ev.Parked(originator_id="batch", originator_version=9, timestamp=datetime.now(timezone.utc),
                       at="2026-01-01T00:00:02.000Z", task_id="b", reason="batch_integration_check_failed: b:A1",
                       candidate="cd" * 20, candidate_ref="refs/lanes-es/failed/batch/b", failed_checks=[failed])
    lines: list[str] = []
    LineProgress(lines.append, clock=lambda: 0.0).tell(event_item("batch", parked))
    assert lines[0].startswith("[   0.0s] b: parked reason=batch_integration_check_failed: b:A1")
    assert "kept as refs/lanes-es/failed/batch/b" in lines[1]
    assert lines[2] == ("    b:A1: python3 exited with code 3, started 2026-01-01T00:00:01.000Z, ran 1.23 s, 40 bytes of "
                        "output, sha256 abababababab")
    assert lines[3:] == [f"      | line {n}" for n in range(8, 20)]  # the last lines of the tail
