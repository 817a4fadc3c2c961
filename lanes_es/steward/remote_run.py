"""A named agent's attempt on a Ray node (the `ray` runner), standing in the autopilot for its process.

The Lane stays a worktree of the coordinator: what it holds now goes to a node (`remote_lane.lane_payload`),
the agent runs there in a checkout of it (adapters/remote_attempt.py), and what it changed comes back.
Here, in a thread of the autopilot: the delivery is written into the Lane only when every path is one
the task may touch (else nothing is, and the attempt is not submitted), then the task is submitted in
the Lane as a local attempt submits it, and the attempt's result file is written where a local attempt
writes its own, so the autopilot records its end the same way. `poll` answers as a process's does.
What the runner noted of the attempt (dispatched, ended or lost on its node) is kept for the autopilot
to take (`take_notes`): its dispatch is recorded as soon as it is sent (the autopilot is woken for it),
so that an autopilot killed meanwhile leaves the attempt open in the log for the next one to cancel on
its node; this thread never writes the log. While it runs, the autopilot reaches the attempt on its node
as it reaches a local one: what its agent reported so far (`live_usage`), and a stop with its reason
(`stop`: a budget spent), which the attempt records as its end.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Callable

import msgspec

from lanes_es.domain.events import ExecutorUsage
from lanes_es.executors.attempt import Attempt, AttemptResult, write_atomically


USAGE_EVERY_SECONDS = 1.0


class RemoteRun:
    """The attempt of `launch` on a cluster (`connect(journal)` gives a RayCheckRunner whose notes go to
    `journal`), run in a thread from now on."""

    pid = None  # no process of this machine: nothing to signal, nothing to adopt after a restart

    def __init__(self, connect: Callable[[Callable[[Any], None]], Any], launch: Any, log: Path, scope: list[str],
                 exited: threading.Event, agent_program: str) -> None:
        self.connect, self.launch, self.log, self.scope = connect, launch, log, scope
        self.agent_program = agent_program
        self.code: int | None = None
        self._notes: list[Any] = []
        self._lock = threading.Lock()
        self._cluster: Any = None
        self._sent: tuple[str, str] | None = None  # (node, attempt id) once dispatched
        self._stop: tuple[str, str] | None = None  # (reason, detail) once asked
        self._usage, self._usage_at = ExecutorUsage(), float("-inf")
        self._exited = exited
        threading.Thread(target=self._run, name=f"lanes-es-remote-{launch.task_id}", daemon=True).start()

    def poll(self) -> int | None:
        return self.code

    def take_notes(self) -> list[Any]:
        """What the runner noted since the last call, oldest first."""
        with self._lock:
            notes, self._notes = self._notes, []
        return notes

    def stop(self, reason: str, detail: str) -> None:
        """Ask the attempt to end on its node, with why (asked before it was sent: asked once it is)."""
        with self._lock:
            self._stop = (reason, detail)
            sent, cluster = self._sent, self._cluster
        if sent is not None and cluster is not None:
            threading.Thread(target=cluster.stop_attempt, args=(*sent, reason, detail), daemon=True).start()

    def live_usage(self) -> ExecutorUsage:
        """What the attempt's agent reported so far on its node (asked at most once a second: the autopilot asks
        on every round)."""
        with self._lock:
            sent, cluster = self._sent, self._cluster
        if sent is None or cluster is None or self.code is not None:
            return ExecutorUsage()
        now = time.monotonic()
        if now - self._usage_at >= USAGE_EVERY_SECONDS:
            self._usage, self._usage_at = cluster.progress(*sent), now
        return self._usage

    def _note(self, note: Any) -> None:
        with self._lock:
            self._notes.append(note)
            if note.kind == "dispatched":
                self._sent = (note.node, note.attempt_id)
            stop, sent, cluster = self._stop, self._sent, self._cluster
        if note.kind == "dispatched":
            self._exited.set()  # the autopilot wakes and records the dispatch before the attempt's end
            if stop is not None and cluster is not None and sent is not None:
                cluster.stop_attempt(*sent, *stop)

    def _run(self) -> None:
        result: AttemptResult
        with open(self.log, "ab") as sink:
            try:
                result = self._attempt(sink)
            except Exception as error:  # noqa: BLE001 - the attempt's end, with why; the autopilot goes on
                sink.write(f"--- lanes-es: the attempt on the cluster failed: {error}\n".encode())
                result = AttemptResult(exit_code=None, duration_ms=0, killed="lost", detail=f"{error}"[:500])
        write_atomically(self.launch.spec.result_path, msgspec.json.encode(result))
        self.code = result.exit_code if result.exit_code is not None else 1
        self._exited.set()

    def _attempt(self, sink: Any) -> AttemptResult:
        from lanes_es.adapters.ray_host import AttemptRequest
        from lanes_es.adapters.remote_lane import DeliveryRefused, lane_payload, write_delivery

        launch = self.launch
        request = AttemptRequest(agent=launch.adapter, program=self.agent_program, prompt=launch.prompt or "",
                                 limits=launch.limits, contract=dict(launch.contract or {}))
        cluster = self._cluster = self.connect(self._note)
        outcome = cluster.run_executor_attempt(launch.task_id, lane_payload(launch.lane), request)
        sink.write(f"--- lanes-es: on node {outcome.node or '?'} (attempt {outcome.attempt_id or '?'})\n".encode())
        sink.write(outcome.output)
        if outcome.result is None:
            return AttemptResult(exit_code=None, duration_ms=0, killed="lost",
                                 detail=f"the attempt was lost on the cluster: {outcome.error or 'its node was lost'}"[:500],
                                 usage=ExecutorUsage())
        result = outcome.result
        try:
            write_delivery(launch.lane, launch.task_id, self.scope, outcome.delivery)
        except DeliveryRefused as refused:
            sink.write(f"--- lanes-es: nothing of the delivery was written: {refused}\n".encode())
            return msgspec.structs.replace(result, submitted=False)
        sink.write(f"--- lanes-es: {len(outcome.delivery)} delivered path(s) written into the Lane\n".encode())
        sink.flush()
        if result.exit_code == 0 and result.killed is None:
            return msgspec.structs.replace(result, submitted=Attempt(launch.spec, out=sink).submit())
        return result
