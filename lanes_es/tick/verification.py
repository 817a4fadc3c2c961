"""Running candidates' checks for the integration step: at most verify_workers at once, the candidate
closest to landing first, a passing verdict on the very same inputs instead of a run, the flake policy,
and cancellation.

A check runs through the CheckRunner port (where the commands run) on the candidate's tree as the
CandidateBuilder port planned it (`CandidateChecks`). What is decided here, in the coordinator's one thread
that writes the log:

- reuse: a task's check (the same acceptance) that already passed in this batch on a tree with the
  same identity (`domain/check_inputs.py`) is not run again; the verdict it reuses is named by an
  event (`CheckVerdictReused`) and on the check (`reused_from`);
- order: the pool takes the waiting check with the lowest priority first (the shortest candidate, then
  plan order), so a failure low in a chain is known before the candidates stacked on it spend workers;
- cancellation: a flight's `Cancel` kills its running commands and skips its waiting ones;
- coverage: a round may name checks that passed on a longer candidate carrying this one (`covering` in
  `domain/candidates.py`); they are not run, and their verdict says which candidate covered them.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable

from lanes_es.domain.check_inputs import reuse_key
from lanes_es.domain.flakes import rerunnable
from lanes_es.ports import (
    Cancel, CandidateCheck, CandidateChecks, CandidateVerdict, PlannedCheck, PortError, check_on,
)
from lanes_es.tick.context import TickContext


class CheckPool:
    """`workers` threads that run the queued check with the lowest priority first (a heap, not a FIFO)."""

    def __init__(self, workers: int) -> None:
        self._heap: list[tuple[Any, int, Callable[[], Any], Future[Any]]] = []
        self._order = itertools.count()
        self._ready = threading.Condition()
        self._closing = False
        self._threads = [threading.Thread(target=self._work, name=f"lanes-es-check-{index}", daemon=True)
                         for index in range(max(workers, 1))]
        for thread in self._threads:
            thread.start()

    def submit(self, priority: Any, job: Callable[[], Any]) -> Future[Any]:
        future: Future[Any] = Future()
        with self._ready:
            heapq.heappush(self._heap, (priority, next(self._order), job, future))
            self._ready.notify()
        return future

    def _work(self) -> None:
        while True:
            with self._ready:
                while not self._heap and not self._closing:
                    self._ready.wait()
                if not self._heap:
                    return
                _, _, job, future = heapq.heappop(self._heap)
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(job())
            except BaseException as error:  # the waiting side decides what an error means
                future.set_exception(error)

    def close(self) -> None:
        """Run what is queued, then stop the threads."""
        with self._ready:
            self._closing = True
            self._ready.notify_all()
        for thread in self._threads:
            thread.join()

    def __enter__(self) -> "CheckPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


@dataclass
class Flight:
    """One candidate's checks under way: what ran (or was reused) so far, and its cancel token.

    `failed` turns True at the first check whose final result (after any flake rerun) fails: the candidate
    then fails, whatever its other checks say, while they still run to the end (its park reason, as
    serial's, names every failed finding)."""

    planned: CandidateChecks
    cancel: Cancel = field(default_factory=Cancel)
    results: dict[str, CandidateCheck] = field(default_factory=dict)
    error: PortError | None = None
    # What kept a check from giving any verdict at all and is no check failure (the Ray cluster lost it past
    # its bound: lanes_es/adapters/ray_runner.py): raised when the verdict is asked for, ending the tick
    # with nothing recorded against the Lanes.
    fault: BaseException | None = None
    pending: int = 0
    failed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def done(self) -> bool:
        with self.lock:
            return self.pending == 0

    def checks(self) -> list[CandidateCheck]:
        with self.lock:
            return [self.results[check.task_id] for check in self.planned.checks if check.task_id in self.results]

    def verdict(self) -> CandidateVerdict | PortError:
        """Once done: the candidate's verdict, or the error that kept its checks from running at all."""
        if self.fault is not None:
            raise self.fault
        return self.error if self.error is not None else CandidateVerdict.of(self.planned.commit, self.checks())

    def finished(self, check: PlannedCheck, future: Future[Any]) -> None:
        with self.lock:
            self.pending -= 1
            try:
                result: CandidateCheck = future.result()
            except PortError as error:
                self.error, self.failed = self.error or error, True
                return
            except Exception as error:  # noqa: BLE001 - kept, and raised in the coordinator's thread
                self.fault = self.fault or error
                return
            self.results[check.task_id] = result
            if result.findings and not result.cancelled:
                self.failed = True


def start_flight(ctx: TickContext, pool: CheckPool, planned: CandidateChecks, lanes: list[str], priority: int,
                 changed: threading.Event, covered: dict[str, str] | None = None) -> Flight:
    """Queue the candidate's checks; a check whose passing verdict on these inputs the batch already holds is
    not queued but reused, and the reuse recorded (`lanes`: the candidate's, for that event); a check in
    `covered` (task id -> the commit of a longer candidate of the round it passed on) is not queued either."""
    flight = Flight(planned=planned)
    flake_reruns = ctx.live.flake_reruns
    for index, check in enumerate(planned.checks):
        reused = ctx.live.reusable_verdict(reuse_key(check.task_id, check.acceptance, planned.tree_identity))
        if reused is not None:
            version, event, commit = reused
            ctx.live.note_check_reused(ctx.now, check.task_id, lanes, planned.commit, planned.tree_identity,
                                       check.acceptance, version, event, commit)
            flight.results[check.task_id] = CandidateCheck(
                task_id=check.task_id, findings=[], tree=planned.tree_identity, acceptance=check.acceptance,
                reused_from=version)
            continue
        if covered and check.task_id in covered:
            flight.results[check.task_id] = CandidateCheck(
                task_id=check.task_id, findings=[], tree=planned.tree_identity, acceptance=check.acceptance,
                covered_by=covered[check.task_id])
            continue
        flight.pending += 1
        future = pool.submit((priority, index), _job(ctx.ports.check_runner, planned, check, flight.cancel,
                                                     flake_reruns))

        def done(future: Future[Any], check: PlannedCheck = check) -> None:
            flight.finished(check, future)
            changed.set()

        future.add_done_callback(done)
    return flight


def _job(runner: Any, planned: CandidateChecks, check: PlannedCheck, cancel: Cancel,
         flake_reruns: int) -> Callable[[], CandidateCheck]:
    """One task's check in a worker thread: run, and again under the flake policy while it allows."""

    def run() -> CandidateCheck:
        if cancel.is_set():  # its candidate was cancelled while it waited for a worker
            return cancelled_check(planned, check)
        result = runner.run_check(planned.tree, check.task_id, check.intent, cancel)
        attempts, first = 1, list(result.findings)
        while (result.findings and not result.cancelled and attempts <= flake_reruns
               and rerunnable(first, check.task_id, check.at_base, check.intent)):
            result = runner.run_check(planned.tree, check.task_id, check.intent, cancel)
            attempts += 1
        flaky = first if first and not result.findings else []
        return check_on(planned.tree_identity, check, result, attempts, flaky)

    return run


def cancelled_check(planned: CandidateChecks, check: PlannedCheck) -> CandidateCheck:
    """A check of a cancelled candidate that never got to run."""
    return CandidateCheck(task_id=check.task_id, findings=[], tree=planned.tree_identity,
                          acceptance=check.acceptance, cancelled=True)


def verify_now(ctx: TickContext, planned: CandidateChecks, lanes: list[str]) -> CandidateVerdict:
    """Every check of one candidate at once (at most verify_workers), waited for: serial's rerun. An error that
    kept a check from running at all is raised, as the serial rerun raised it."""
    changed = threading.Event()
    with CheckPool(verify_workers(ctx)) as pool:
        flight = start_flight(ctx, pool, planned, lanes, 0, changed)
        while not flight.done:
            changed.wait()
            changed.clear()
    verdict = flight.verdict()
    if isinstance(verdict, PortError):
        raise verdict
    return verdict


def verify_workers(ctx: TickContext) -> int:
    return max(ctx.live.verify_workers or ctx.limit, 1)
