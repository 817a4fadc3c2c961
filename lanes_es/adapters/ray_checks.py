"""The CheckRunner port on a Ray cluster (the `ray` runner), and the journal of what it sent where.

`RayChecks` runs each candidate check through `RayCheckRunner` (lanes_es/adapters/ray_runner.py) and
answers as the local runner does: a run that could not complete is an IntegrationError (a check failure,
never a pass), a cancelled one is `cancelled`. The runner's notes (each attempt dispatched, ended or
lost) are kept here, in the order they happened, until the tick's one writing thread takes them
(`drain`) and records each as an event: worker threads never touch the log.
"""

from __future__ import annotations

import threading
from typing import Any

from lanes_es.adapters.check_runner import CHECK_FAILED
from lanes_es.ports import CheckRun, IntegrationError


class RayChecks:
    """Checks (and the notes of their attempts) on the cluster `runner` for batch `batch_id`."""

    def __init__(self, runner: str, batch_id: str) -> None:
        from lanes_es.adapters.ray_runner import RayCheckRunner

        self._notes: list[Any] = []
        self._lock = threading.Lock()
        # Called after each note (the round's wake-up): the writing thread records a dispatch as soon as it
        # is sent, not at the next check's end, so that a coordinator killed meanwhile leaves it in the log.
        self.wake: Any = None
        self.cluster = RayCheckRunner(runner, batch_id, self._note)

    def _note(self, note: Any) -> None:
        with self._lock:
            self._notes.append(note)
        if self.wake is not None:
            self.wake()

    def drain(self) -> list[Any]:
        """The notes since the last drain (`ray_runner.AttemptNote`), oldest first."""
        with self._lock:
            notes, self._notes = self._notes, []
        return notes

    def run_check(self, tree: Any, task_id: str, intent: dict[str, Any], cancel: Any = None) -> CheckRun:
        if cancel is not None and cancel.is_set():  # its candidate was cancelled before it was sent
            return CheckRun(task_id=task_id, findings=[], cancelled=True)
        result = self.cluster.run_attempts(tree, task_id, intent, cancel)
        if result.error is not None:
            raise IntegrationError(CHECK_FAILED, f"{CHECK_FAILED}: the descriptor rerun could not complete: "
                                                 f"{result.error}")
        return CheckRun(task_id=task_id, findings=list(result.findings), outputs=list(result.outputs),
                        cancelled=result.cancelled or (cancel is not None and cancel.is_set()))

    def run_qa(self, lane: str, task_id: str, intent: dict[str, Any]) -> Any:
        """A Lane's QA on the cluster, on its files as local QA copies them (`qa.run_qa_on_worktree`'s answer:
        the verdict, each item's output digest, the identity of the tree it saw)."""
        from lanes_es.adapters.qa import Finding, QaRun, Verdict
        from lanes_es.adapters.ray_cluster import RayUnavailable
        from lanes_es.adapters.remote_lane import lane_tree

        tree = lane_tree(lane)
        result = self.cluster.run_attempts(tree, task_id, intent, work="qa")
        if result.error is not None or len(result.reasons) != len(result.findings):
            raise RayUnavailable(f"the QA of {task_id} could not run on node {result.node} of {self.cluster.runner} "
                                 f"({result.error or 'a malformed answer'}); nothing was recorded against the Lane: "
                                 f"run the tick again")
        findings = [Finding(id=found, reason=reason) for found, reason in zip(result.findings, result.reasons)]
        return QaRun(verdict=Verdict(decision="rework" if findings else "pass", findings=findings),
                     outputs=list(result.outputs), tree=tree.identity)

    def settle_open(self, attempts: dict[str, Any]) -> None:
        """Attempts an earlier coordinator of this batch sent (`ray_runner.settle`); the note of each goes to the
        journal."""
        from lanes_es.adapters.ray_runner import settle

        for note in settle(self.cluster, attempts):
            self._note(note)
