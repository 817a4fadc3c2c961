"""A named agent's attempt on a Ray node (the `ray` runner), standing in the autopilot for its process.

The Lane stays a worktree of the coordinator: what it holds now goes to a node (`remote_lane.lane_payload`),
the agent runs there in a checkout of it (adapters/remote_attempt.py), and what it changed comes back.
Here, in a thread of the autopilot: the delivery is written into the Lane only when every path is one
the task may touch (else nothing is, and the attempt is not submitted), then the task is submitted in
the Lane as a local attempt submits it, and the attempt's result file is written where a local attempt
writes its own, so the autopilot records its end the same way. `poll` answers as a process's does.
What the runner noted of the attempt (dispatched, ended or lost on its node) is kept in `notes` for
the autopilot to record with the attempt's end: this thread never writes the log.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable

import msgspec

from lanes_es.domain.events import ExecutorUsage
from lanes_es.executors.attempt import Attempt, AttemptResult, write_atomically


class RemoteRun:
    """The attempt of `launch` on a cluster (`connect(journal)` gives a RayCheckRunner whose notes go to
    `journal`), run in a thread from now on."""

    pid = None  # no process of this machine: nothing to signal, nothing to adopt after a restart

    def __init__(self, connect: Callable[[Callable[[Any], None]], Any], launch: Any, log: Path, scope: list[str],
                 exited: threading.Event, agent_program: str) -> None:
        self.connect, self.launch, self.log, self.scope = connect, launch, log, scope
        self.agent_program = agent_program
        self.code: int | None = None
        self.notes: list[Any] = []
        self._exited = exited
        threading.Thread(target=self._run, name=f"lanes-es-remote-{launch.task_id}", daemon=True).start()

    def poll(self) -> int | None:
        return self.code

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
        cluster = self.connect(self.notes.append)
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
