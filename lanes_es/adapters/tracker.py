"""Tracker adapters: how an integrated child's Issue gets closed.

A Local Initiative has no tracker by default. A tracker command (LANES_ES_TRACKER_COMMAND,
plain argv, no shell) receives one JSON object on stdin, {op:"mark-terminal", task_id,
phase:"done", terminal_event_id, root}, and answers one JSON object on stdout,
{status, message}; a failure to run or to answer is `retryable_failure`. What it writes is read with
bounded memory, and what the log records is bounded too: an excerpt, the length and sha256 of the whole.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import subprocess

from lanes_es.adapters.processes import run_bounded, truncated_excerpt
from lanes_es.domain.jstext import parse_json
from lanes_es.ports import TrackerResult

ANSWER_BYTES = 65536  # an answer is one small JSON object; more is read to its end (for its digest), not kept
DETAIL_CHARS = 500    # of stderr, or of an answer too long, in the recorded message
MESSAGE_CHARS = 2000  # of the tracker's own message

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
            code, out, err = run_bounded(self.argv, root, json.dumps(request).encode(), self.timeout_seconds,
                                         keep_stdout=ANSWER_BYTES, keep_stderr=DETAIL_CHARS)
        except (OSError, subprocess.TimeoutExpired) as error:
            return TrackerResult(status="retryable_failure", message=f"tracker command failed: {error}")
        if out.truncated:
            return TrackerResult(status="retryable_failure",
                                 message=f"tracker command answered more than {ANSWER_BYTES} bytes, not one JSON "
                                         f"object: {out.excerpt(DETAIL_CHARS)}")
        try:
            answer = parse_json(out.head.decode("utf-8", "replace") or "null")
        except ValueError:  # not JSON, or nested too deeply
            answer = None
        if (code != 0 or not isinstance(answer, dict) or answer.get("status") not in KNOWN_STATUSES
                or not isinstance(answer.get("message", ""), str)):
            return TrackerResult(status="retryable_failure",
                                 message=f"tracker command exited {code} without a valid answer "
                                         f"{err.excerpt(DETAIL_CHARS)}".strip())
        message = answer.get("message", "")
        if len(message) > MESSAGE_CHARS:  # recorded in the log: an excerpt and the digest of the whole
            whole = message.encode("utf-8", "surrogatepass")
            message = truncated_excerpt(message, MESSAGE_CHARS, len(whole), hashlib.sha256(whole).hexdigest())
        return TrackerResult(status=answer["status"], message=message)
