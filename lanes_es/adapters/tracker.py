"""Tracker adapters: how an integrated child's Issue gets closed.

A Local Initiative has no tracker by default. A tracker command (LANES_ES_TRACKER_COMMAND,
plain argv, no shell) receives one JSON object on stdin, {op:"mark-terminal", task_id,
phase:"done", terminal_event_id, root}, and answers one JSON object on stdout,
{status, message}; a failure to run or to answer is `retryable_failure`.
"""

from __future__ import annotations

import json
import shlex
import subprocess

from lanes_es.ports import TrackerResult

KNOWN_STATUSES = frozenset({"created", "updated", "already_current", "retryable_failure", "permanent_failure",
                            "ambiguous_remote_state"})


class CommandTracker:
    def __init__(self, command: str, timeout_seconds: float = 120) -> None:
        self.argv = shlex.split(command)
        self.timeout_seconds = timeout_seconds

    def mark_terminal(self, root: str, task_id: str, phase: str, terminal_event_id: str) -> TrackerResult:
        request = {"op": "mark-terminal", "task_id": task_id, "phase": phase,
                   "terminal_event_id": terminal_event_id, "root": root}
        try:
            done = subprocess.run(self.argv, input=json.dumps(request).encode(), capture_output=True, cwd=root,
                                  timeout=self.timeout_seconds, check=False)
        except (OSError, subprocess.TimeoutExpired) as error:
            return TrackerResult(status="retryable_failure", message=f"tracker command failed: {error}")
        try:
            answer = json.loads(done.stdout.decode("utf-8", "replace") or "null")
        except json.JSONDecodeError:
            answer = None
        if (done.returncode != 0 or not isinstance(answer, dict) or answer.get("status") not in KNOWN_STATUSES
                or not isinstance(answer.get("message", ""), str)):
            detail = done.stderr.decode("utf-8", "replace").strip()[:500]
            return TrackerResult(status="retryable_failure",
                                 message=f"tracker command exited {done.returncode} without a valid answer {detail}".strip())
        return TrackerResult(status=answer["status"], message=answer.get("message", ""))
