"""The autopilot's loop: tick, release and provision Lanes, start Executors, wait, tick again.

All the batch's state is in the log and in git: killed and started again, the loop re-offers
the Lanes it had made and starts the Executors again for the executor handoffs.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import msgspec

from lanes_es.adapters.batch_git import MAX_INTENT_BYTES
from lanes_es.adapters.files import read_capped_text
from lanes_es.adapters.store import StoreConflict, StoreOutage
from lanes_es.domain import events as ev
from lanes_es.domain.executor_budget import Exhausted, spent_while_running
from lanes_es.domain.record import IN_FLIGHT
from lanes_es.ports import GitFailure
from lanes_es.steward.attempts import AttemptLog, ended_text
from lanes_es.steward.executors import SUBMITTING_WAIT_SECONDS, Executors
from lanes_es.steward.lanes import Steward, StewardRefusal
from lanes_es.steward.lease import StewardLease
from lanes_es.steward.feed import BatchFeed, subjects
from lanes_es.steward.progress import Board, Progress, Row, note_item, steward_item
from lanes_es.steward.summary import exit_code, summary_lines
from lanes_es.tick_input import LaneOfferInput
from lanes_es.usecases.deps import Deps
from lanes_es.usecases.load import current_authorization
from lanes_es.usecases.tick import TickResult, tick as tick_batch

# While a tick runs, its new events are read this often (a long integration round tells its candidates).
WATCH_SECONDS = 0.5
T = TypeVar("T")


@dataclass
class Autopilot:
    deps: Deps
    slug: str
    max_parallel: int
    steward: Steward
    executors: Executors
    progress: Progress
    poll: float = 1.0
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    since: dict[str, tuple[str, float]] = field(default_factory=dict)
    offered: dict[str, str] = field(default_factory=dict)  # task -> the base head its Lane was offered at
    refused: dict[str, tuple[str, str]] = field(default_factory=dict)  # task -> (reason, base head)
    released: list[str] = field(default_factory=list)
    kept: dict[str, str] = field(default_factory=dict)  # task -> why its Lane was not removed
    steward_refusals: dict[str, str] = field(default_factory=dict)
    feed: BatchFeed | None = None  # the batch's log, told as it grows
    last_events: dict[str, str] = field(default_factory=dict)  # task -> what its latest event said
    round: str = ""  # the latest event about several Lanes at once (an integration round)
    report: dict[str, Any] | None = None  # the latest tick's report: the board between ticks
    lease: StewardLease | None = None  # this run's steward lease, confirmed before each round of moves
    anchor_told: str = ""  # why the last checkpoint was not written, as already told
    attempts: AttemptLog | None = None  # records each Executor attempt in the batch's log
    attempts_settled: bool = False
    budgets: ev.ExecutorBudgets | None = None  # the Executor budgets of the batch's latest authorization
    budget_stopped: set[str] = field(default_factory=set)  # tasks stopped for a budget
    ended_for_budget: set[tuple[str, int]] = field(default_factory=set)  # (task, attempt) asked to end

    def run(self) -> int:
        offers: list[LaneOfferInput] = []
        idle = 0
        self.follow_current_batch()
        while True:
            self.record_submitted_attempts()
            result = self.tick(offers)
            report = self.report = result.report
            self.settle_attempts(report)
            if self.feed is not None:
                self.feed.follow(result.batch_id)
            self.through_outages(self.tell_news)
            for line in result.drift:
                self.tell("drift_repaired", f"drift repaired: {line}", drift=line)
            if result.anchor_problem and result.anchor_problem != self.anchor_told:  # once, not on every tick
                self.anchor_told = result.anchor_problem
                self.tell("checkpoint_not_written", f"checkpoint not written: {result.anchor_problem}",
                          reason=result.anchor_problem)
            self.note_refusals(report)
            self.show(report)
            if report["batch_state"] != "running":
                self.wait_for_all()
                self.confirm_lease()
                self.steward.begin_round()
                self.release_lanes(report)
                return self.finish(report)
            if any(handoff["role"] == "coordinator" for handoff in report["handoffs"]):
                return self.finish(report, stopped_for="coordinator")
            self.confirm_lease()
            self.steward.begin_round()
            released = self.release_lanes(report)
            offers = self.provision_lanes(report)
            self.start_executors(report)
            if offers or released:
                idle = 0
                continue
            if self.executors.running:
                self.wait_for_an_exit(report)
                idle = 0
                continue
            # Nothing to do and nobody working: one more tick may still move (a retried tracker
            # close, a leak restored); a second idle round means only a person can move it.
            idle += 1
            if idle >= 2:
                return self.finish(report, stopped_for="stuck")
            self.sleep(self.poll)

    def confirm_lease(self) -> None:
        if self.lease is not None:
            self.through_outages(self.lease.confirm)

    def follow_current_batch(self) -> None:
        """Follow the batch this run goes on with, from its newest event: a resumed run tells only what is new."""
        current = self.through_outages(lambda: current_authorization(self.deps, self.slug))
        if self.feed is None or current is None:
            return
        batch_id = current.batch_id
        batch = self.through_outages(lambda: self.deps.store.batch(batch_id))
        already = batch.version if batch is not None else 0
        self.feed.follow(batch_id, after=already)
        if already:
            self.progress.tell(note_item(f"going on with batch {batch_id}: its log holds {already} events already "
                                         f"(`lanes-es replay {batch_id}` shows them); new ones follow"))

    def through_outages(self, action: Callable[[], T]) -> T:
        """`action`, tried again every `poll` seconds while the store is out (a PostgreSQL server down or
        unreachable), as long as it takes: said once when it goes, and once when it is back. The
        Executors keep working meanwhile; the log and git keep every step, so nothing is lost either way."""
        began: float | None = None
        while True:
            try:
                result = action()
            except StoreOutage as outage:
                if began is None:
                    began = self.clock()
                    self.tell("store_outage", f"store outage: the event store {outage.store} does not answer "
                                              f"({outage.reason}); waiting for it, trying again every {self.poll:g}s "
                                              f"(the Executors keep working; Ctrl-C stops the run, and the same "
                                              f"command goes on later)", store=outage.store, reason=outage.reason)
                self.sleep(self.poll)
                continue
            if began is not None:
                waited = self.clock() - began
                self.tell("store_back", f"the event store answers again after {waited:.0f}s; going on",
                          seconds=round(waited, 1))
            return result

    # ------------------------------------------------------------ one tick

    def tick(self, offers: list[LaneOfferInput]) -> TickResult:
        """One tick; while another tick holds the batch (busy), tick again shortly, as often as it takes;
        through a store outage, once the store is back (a tick the outage cut short wrote what it saved)."""
        told = False
        while True:
            try:
                with self.watching():
                    result = self.through_outages(lambda: tick_batch(self.deps, self.slug,
                                                                     max_parallel=self.max_parallel, offers=offers))
                if result.report.get("outcome") != "busy":
                    return result
                why = str(result.report.get("reason") or "another tick holds the batch")
            except StoreConflict as error:
                why = str(error)
            if not told:
                told = True
                self.tell("busy", f"busy: {why}; ticking again every {self.poll:g}s until it ends", reason=why)
            self.sleep(self.poll)

    @contextmanager
    def watching(self) -> Iterator[None]:
        """While a tick runs, tell the events it records as they come (a long integration round's candidates)."""
        stop = threading.Event()

        def watch() -> None:
            while not stop.wait(WATCH_SECONDS):
                try:
                    self.tell_news()
                except Exception:  # a read racing the tick's own writes: the loop reads again after the tick
                    continue

        watcher = threading.Thread(target=watch, name="lanes-es-run-watcher", daemon=True)
        watcher.start()
        try:
            yield
        finally:
            stop.set()
            watcher.join()

    def note_refusals(self, report: dict[str, Any]) -> None:
        for refusal in report.get("lane_refusals", []):
            task_id = refusal["task_id"]
            self.refused[task_id] = (refusal["reason"], self.offered.get(task_id, ""))
            self.tell("offer_refused", f"offer of {refusal['path']} for {task_id} refused: {refusal['reason']}",
                      task_id=task_id, path=refusal["path"], reason=refusal["reason"])

    # ------------------------------------------------------------ the steward's moves

    def release_lanes(self, report: dict[str, Any]) -> bool:
        lanes = {child["task_id"]: child["lane"] for child in report["children"] if child.get("lane")}
        states = {child["task_id"]: child.get("state") for child in report["children"]}
        released = False
        for handoff in report["handoffs"]:
            if handoff["role"] != "lane-steward" or handoff["action"] != "release":
                continue
            task_id = handoff["task_id"]
            lane = lanes.get(task_id)
            if lane is None or task_id in self.released or task_id in self.kept:
                continue
            if task_id in self.executors.running:
                continue  # its Executor is still exiting: the Lane goes on a later tick, never from under it
            integrated = lane.get("lane_commit") if states.get(task_id) in ("integrated", "released") else None
            why_kept = self.steward.release(lane["path"], handoff["lane_branch"], integrated)
            if why_kept is None:
                self.released.append(task_id)
                released = True
                self.tell("lane_released", f"steward: released the Lane of {task_id} ({lane['path']})",
                          task_id=task_id, path=lane["path"])
            else:
                self.kept[task_id] = f"{lane['path']}: {why_kept}"
                self.tell("lane_kept", f"steward: kept the Lane of {task_id}: {lane['path']}: {why_kept}",
                          task_id=task_id, path=lane["path"], reason=why_kept)
        return released

    def provision_lanes(self, report: dict[str, Any]) -> list[LaneOfferInput]:
        offers: list[LaneOfferInput] = []
        for handoff in report["handoffs"]:
            if handoff["role"] != "lane-steward" or handoff["action"] != "provision":
                continue
            task_id, base_head = handoff["task_id"], handoff["base_head"]
            refused = self.refused.get(task_id)
            if refused is not None and refused[1] == base_head:
                continue  # offered at this head and refused: again would be refused the same way
            try:
                path = self.steward.provision(task_id, handoff["lane_branch"], base_head)
            except (StewardRefusal, GitFailure) as error:
                if self.steward_refusals.get(task_id) != str(error):
                    self.tell("lane_refused", f"steward: cannot make the Lane of {task_id}: {error}",
                              task_id=task_id, reason=str(error))
                self.steward_refusals[task_id] = str(error)
                continue
            self.steward_refusals.pop(task_id, None)
            self.refused.pop(task_id, None)  # a refusal of this offer comes back in the next report
            self.offered[task_id] = base_head
            offers.append(LaneOfferInput(task_id=task_id, path=path))
            self.tell("lane_provisioned", f"steward: offering {path} for {task_id} on {handoff['lane_branch']}",
                      task_id=task_id, path=path, branch=handoff["lane_branch"], base_head=base_head)
        return offers

    def settle_attempts(self, report: dict[str, Any]) -> None:
        """Ends not recorded yet, and attempts an earlier autopilot left under way in the log, are recorded."""
        if self.attempts is None:
            return
        if not self.attempts_settled:
            self.attempts_settled = True
            for task_id in self.attempts.settle_open(report["batch_id"]):
                self.tell("attempt_settled", f"executor: recorded how the last attempt of {task_id}, started by an "
                                             f"earlier run, ended", task_id=task_id)
        self.attempts.flush()

    def start_executors(self, report: dict[str, Any]) -> None:
        waiting = [handoff for handoff in report["handoffs"] if handoff["role"] == "executor"
                   and handoff["task_id"] not in self.budget_stopped and handoff["task_id"] not in self.executors.running]
        handoffs = [handoff for handoff in waiting if self.executors.should_start(handoff)]
        if not waiting:
            return
        current = self.through_outages(lambda: current_authorization(self.deps, self.slug))
        self.budgets = current.executor_budget if current is not None else None
        self.stop_idle_over_budget(report["batch_id"], [handoff for handoff in waiting if handoff not in handoffs])
        for handoff in handoffs:
            assert self.attempts is not None
            running = self.attempts.start(report["batch_id"], handoff, self.intent_text(handoff, current),
                                          self.budgets, self.executors.live_spent())
            if isinstance(running, Exhausted):
                self.stop_for_budget(report["batch_id"], handoff, running)
                continue
            if running is None:
                continue  # the batch is busy: recorded and started on a later round
            self.tell("executor_started", f"executor: started for {handoff['task_id']} in {handoff['lane_path']} "
                                          f"(attempt {running.attempt}, {running.adapter}, pid {running.process.pid}, "
                                          f"next: {handoff.get('next_obligation')})",
                      task_id=handoff["task_id"], pid=running.process.pid, path=handoff["lane_path"],
                      next_obligation=handoff.get("next_obligation"), attempt=running.attempt, adapter=running.adapter)

    def stop_for_budget(self, batch_id: str, handoff: dict[str, Any], spent: Exhausted) -> None:
        """A task whose next attempt would start over a budget: recorded, then stopped as `lanes-es task stop`
        stops it (the next tick parks it), with a reason that names the budget and how to raise it."""
        from lanes_es.adapters.kernel import ReferenceKernel
        from lanes_es.ports import KernelError

        assert self.attempts is not None
        task_id, lane = handoff["task_id"], handoff["lane_path"]
        detail = f"{spent.text()}; {spent.raise_text(self.slug)}"
        if not self.attempts.exhaust(batch_id, task_id, spent, detail):
            return  # the batch is busy: decided again on a later round
        self.budget_stopped.add(task_id)
        try:
            ReferenceKernel().stop(lane, f"executor budget: {detail}", task_id=task_id)
        except (KernelError, OSError) as error:  # stopped already (an earlier run), or the Lane is gone
            self.tell("budget_stop_failed", f"executor: {task_id}'s task could not be stopped: {error}",
                      task_id=task_id, reason=str(error))
        self.tell("budget_exhausted", f"executor: {task_id} not started again: {spent.text()}; its task is stopped "
                                      f"and parks", task_id=task_id, scope=spent.scope, measure=spent.measure,
                  limit=spent.limit, spent=spent.spent)

    def stop_idle_over_budget(self, batch_id: str, idle: list[dict[str, Any]]) -> None:
        """A task that waits for work no attempt will start for (its last one ended without moving it, killed at
        its limit for one) is stopped too once its budget is spent, rather than left waiting."""
        if self.budgets is None or self.attempts is None:
            return
        for handoff in idle:
            if self.executors.agent is not None and handoff.get("next_obligation") != "submit_assurance":
                continue  # a Review is a person's, whatever the Executors spent
            spent = self.attempts.over_budget(batch_id, handoff["task_id"], self.budgets, self.executors.live_spent())
            if spent is not None:
                self.stop_for_budget(batch_id, handoff, spent)

    def end_over_budget(self) -> None:
        """The Initiative's budget, with what the running attempts reported so far: once spent, every running
        attempt is ended (each records why); a Lane's own attempt is bounded by the limits it started with."""
        if self.attempts is None or not self.executors.running or self.budgets is None:
            return
        spent = spent_while_running(self.budgets, self.attempts.spent + self.executors.live_spent())
        if spent is None:
            return
        for task_id, running in sorted(self.executors.running.items()):
            if (task_id, running.attempt) in self.ended_for_budget:
                continue
            self.ended_for_budget.add((task_id, running.attempt))
            self.executors.stop(task_id, "budget", f"the attempt was ended: {spent.text()}")
            self.tell("budget_exhausted", f"executor: ending the attempt of {task_id}: {spent.text()}",
                      task_id=task_id, scope=spent.scope, measure=spent.measure, limit=spent.limit, spent=spent.spent)

    def intent_text(self, handoff: dict[str, Any], current: ev.BatchAuthorized | None) -> str:
        """The task's TaskIntent as its Lane holds it, at the path the plan recorded."""
        children = current.children if current else []
        relative = next((c.intent_path for c in children if c.task_id == handoff["task_id"] and c.intent_path),
                        f"docs/plans/{handoff['task_id']}.intent.json")
        try:
            return read_capped_text(Path(handoff["lane_path"]) / relative, MAX_INTENT_BYTES)
        except (OSError, ValueError) as error:  # unreadable, not UTF-8, or larger than any intent
            self.tell("intent_unreadable", f"executor: the intent of {handoff['task_id']} is unreadable in its "
                                           f"Lane: {error}", task_id=handoff["task_id"], reason=str(error))
            return ""

    def record_submitted_attempts(self) -> None:
        """The ends of attempts that are submitting their work, recorded before the tick that may take that work up:
        a tick that integrates it and settles the batch would otherwise total the batch's attempts without them."""
        if self.report is None or not self.executors.running:
            return
        self.executors.wait_for_submitting(SUBMITTING_WAIT_SECONDS)
        self.tell_exits(self.executors.reap())

    def wait_for_an_exit(self, report: dict[str, Any]) -> None:
        while True:
            if self.tell_exits(self.executors.reap()):
                return
            self.record_dispatches()
            self.end_over_budget()
            self.show()
            self.executors.wait_for_exit(self.poll)  # woken by an exit at once; the poll for adopted survivors

    def wait_for_all(self) -> None:
        if self.executors.running:
            names = ", ".join(sorted(self.executors.running))
            self.tell("waiting_for_executors", f"waiting for the running Executors to exit: {names}",
                      task_ids=sorted(self.executors.running))
        while self.executors.running:
            self.tell_exits(self.executors.reap())  # an Executor may exit after the batch settled: still told
            if self.executors.running:
                self.executors.wait_for_exit(self.poll)

    def record_dispatches(self) -> None:
        """Attempts just sent to Ray nodes: their dispatch recorded now, not with their end, so that a run killed
        meanwhile leaves them open in the log for the next run to cancel on their nodes."""
        notes = self.executors.take_remote_notes()
        if notes and self.attempts is not None and self.report is not None:
            self.attempts.note_remote(self.report["batch_id"], notes)

    def tell_exits(self, finished: list[Any]) -> bool:
        if finished and self.attempts is not None and self.report is not None:
            self.attempts.end(self.report["batch_id"], finished)
        for done in finished:
            self.tell("executor_exited", f"executor: {done.task_id} {ended_text(done)} (log {done.log})",
                      task_id=done.task_id, exit_code=done.exit_code, seconds=round(done.seconds, 3),
                      log=str(done.log), attempt=done.attempt,
                      **({"result": msgspec.to_builtins(done.result)} if done.result is not None else {}))
        return bool(finished)

    # ------------------------------------------------------------ what it tells

    def tell(self, action: str, text: str, **facts: Any) -> None:
        self.progress.tell(steward_item(action, text, **facts))

    def tell_event(self, item: dict[str, Any]) -> None:
        """A log event: told, and remembered as its Lanes' last event (or the round's news)."""
        self.progress.tell(item)
        named = subjects(item)
        for task_id in named:
            self.last_events[task_id] = item["text"].split(": ", 1)[-1]
        if len(named) > 1:
            self.round = item["text"]

    def tell_news(self) -> None:
        """The log's events not yet told, then the board."""
        if self.feed is not None:
            self.feed.drain(self.tell_event)
        self.show()

    def show(self, report: dict[str, Any] | None = None) -> None:
        report = report or self.report
        if report is None:
            return
        now = self.clock()
        rows: list[Row] = []
        for child in report["children"]:
            task_id, state = child["task_id"], child["state"]
            note = self.note_of(task_id)
            key = f"{state}|{note}"
            if self.since.get(task_id, ("", 0.0))[0] != key:
                self.since[task_id] = (key, now)
            rows.append(Row(task_id, state, self.since[task_id][1], note, self.last_events.get(task_id, "")))
        done = sum(1 for child in report["children"] if child["state"] not in IN_FLIGHT and child["state"] != "pending")
        self.progress.show(Board(report["batch_id"], report["batch_state"], len(self.executors.running), done,
                                 len(report["children"]), rows, self.round))

    def note_of(self, task_id: str) -> str:
        if task_id in self.executors.running:
            return f"Executor working (pid {self.executors.running[task_id].process.pid})"
        if task_id in self.kept:
            return "Lane kept"
        if task_id in self.steward_refusals:
            return "no Lane: see the steward's note"
        if task_id in self.refused:
            return f"offer refused: {self.refused[task_id][0]}"
        finished = self.executors.finished.get(task_id)
        if finished is not None and finished.exit_code != 0:
            return f"Executor exited {finished.exit_code}"
        return ""

    # ------------------------------------------------------------ the end

    def finish(self, report: dict[str, Any], stopped_for: str | None = None) -> int:
        self.wait_for_all()
        if self.attempts is not None:
            self.attempts.flush()
            self.attempts.anchor_recorded()  # the last attempts' ends came after the last tick
        if self.feed is not None:
            self.feed.drain(self.tell_event)  # the last attempts' ends, recorded after the last tick
        self.show(report)
        self.progress.close()
        code = exit_code(report)
        self.progress.tell({"kind": "summary", "batch_id": report["batch_id"], "batch_state": report["batch_state"],
                            "exit_code": code, "stopped_for": stopped_for,
                            "children": [{key: child.get(key) for key in ("task_id", "state", "commit", "reason")}
                                         for child in report["children"]],
                            "lines": summary_lines(self, report, stopped_for)})
        return code
