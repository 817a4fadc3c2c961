"""One Executor attempt of a named agent, as a process of its own: `python -P -m lanes_es.executors.attempt SPEC`.

The autopilot writes the attempt's spec (argv, Lane, limits, where to write) and starts this in the
Lane, with the agent's environment. It

1. starts the agent in its own session, stdin closed, the Lane as its working directory, with the
   kernel's parent-death signal: killed outright, this process takes the agent with it (never an agent
   running on past its limits with no one watching);
2. copies the agent's output to the attempt's log and reads its usage as it comes (usage.py),
   rewriting the progress file whenever the usage changes (the autopilot adds the attempts up);
3. kills the agent's whole process group when the attempt passes its wall-clock limit, its token
   or cost limit, or when the autopilot asks it to stop (SIGTERM, with the reason in the stop file)
   or Ctrl-C reaches it;
4. when the agent ended by itself with exit 0 and its task still waits for a delivery, runs
   `lanes-es task submit` in the Lane, through the interpreter running this (no activated venv
   needed): exit 0 is never taken as success, the coordinator's QA and scope check decide (an
   attempt on a Ray node has no Lane there: the coordinator submits after writing its delivery);
5. writes the result file, which the autopilot records as the attempt's end.

A process of its own, so that an autopilot killed mid-attempt loses nothing: the attempt goes on,
submits, and leaves its result for the next autopilot to record. Nothing here writes to the log.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from lanes_es.adapters.processes import kill_group, start_tied_group
from lanes_es.domain.events import ExecutorUsage
from lanes_es.executors import agent_named

READ_CHUNK = 65536
POLL_SECONDS = 0.25
MAX_LINE = 16 * 1024 * 1024  # a longer line is logged, never parsed
SUBMIT_SECONDS = 300
LIMIT_GRACE_SECONDS = 2.0


class AttemptSpec(msgspec.Struct, frozen=True, kw_only=True):
    agent: str
    argv: list[str]
    lane: str
    timeout_seconds: float
    timeout_reason: str = "timeout"  # or "budget", when the Lane's or the Initiative's wall time binds first
    timeout_detail: str = ""
    max_tokens: int | None = None
    max_cost_usd: float | None = None
    tmpdir: str | None = None
    result_path: str
    progress_path: str
    stop_path: str
    submit_argv: list[str]


class AttemptResult(msgspec.Struct, frozen=True, kw_only=True):
    exit_code: int | None
    duration_ms: int
    killed: str | None = None  # timeout | budget | interrupted | stopped: why it was ended
    detail: str = ""
    submitted: bool | None = None  # None: not tried (the agent failed or was killed)
    usage: ExecutorUsage = ExecutorUsage()


class StopRequest(msgspec.Struct, frozen=True, kw_only=True):
    reason: str
    detail: str


def submitting_marker(result_path: str | Path) -> Path:
    """Written by an attempt just before it submits: its end follows within moments, and the autopilot records
    that end before the tick that may take the submitted work up (the batch's totals then count it)."""
    return Path(f"{result_path}.submitting")


def write_atomically(path: str | Path, data: bytes) -> None:
    path = Path(path)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_bytes(data)
    os.replace(temporary, path)


PROGRESS_LIMIT = 64 * 1024  # the most of a progress file read: the attempt writes one small usage object


def read_progress(path: str | Path) -> ExecutorUsage:
    """What a running attempt's agent has reported so far (its progress file), nothing when it has not."""
    try:
        with open(path, "rb") as handle:
            return msgspec.json.decode(handle.read(PROGRESS_LIMIT), type=ExecutorUsage)
    except (OSError, msgspec.DecodeError):
        return ExecutorUsage()


def ask_to_stop(stop_path: str | Path, pid: int, reason: str, detail: str) -> None:
    """Ask the attempt process `pid` to end, as its `request_stop` reads it: why, in its stop file, then SIGTERM
    (it kills its agent and records the reason). Nothing when it has ended meanwhile."""
    try:
        write_atomically(stop_path, msgspec.json.encode(StopRequest(reason=reason, detail=detail)))
        os.kill(pid, signal.SIGTERM)
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass


class Attempt:
    def __init__(self, spec: AttemptSpec, out: Any = None) -> None:
        agent = agent_named(spec.agent)
        if agent is None:
            raise SystemExit(f"lanes-es attempt: no adapter named {spec.agent!r}")
        self.spec = spec
        self.reader = agent.reader()
        self.out = out or sys.stdout.buffer
        self.stop: tuple[str, str] | None = None

    def request_stop(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGINT:
            self.stop = ("interrupted", "Ctrl-C reached the attempt")
            return
        try:
            asked = msgspec.json.decode(Path(self.spec.stop_path).read_bytes(), type=StopRequest)
            self.stop = (asked.reason, asked.detail)
        except (OSError, msgspec.DecodeError):
            self.stop = ("stopped", "the autopilot stopped the attempt")

    def run(self) -> AttemptResult:
        began = time.monotonic()
        environment = dict(os.environ)
        if self.spec.tmpdir:  # inside the Lane, ignored by git: the one writable place holds the agent's temp files too
            os.makedirs(self.spec.tmpdir, mode=0o700, exist_ok=True)
            environment["TMPDIR"] = self.spec.tmpdir
        self.out.write(f"--- lanes-es: {self.spec.agent} attempt in {self.spec.lane}\n".encode())
        self.out.flush()
        try:
            process = start_tied_group(self.spec.argv, cwd=self.spec.lane, env=environment, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=None)
        except OSError as error:
            self.reader.note_error(f"{self.spec.argv[0]} could not start: {error.strerror or error}")
            return AttemptResult(exit_code=127, duration_ms=elapsed_ms(began), usage=self.reader.usage())
        killed = self.supervise(process, began)
        code = process.returncode
        usage = self.reader.usage()
        if killed is not None:
            return AttemptResult(exit_code=code, duration_ms=elapsed_ms(began), killed=killed[0], detail=killed[1],
                                 usage=usage)
        duration = elapsed_ms(began)
        # No submit_argv: the attempt ran away from its Lane (a Ray node), and the coordinator submits
        # once its delivery is written into the Lane.
        submitted = None
        if code == 0 and self.spec.submit_argv:
            submitting_marker(self.spec.result_path).touch()
            submitted = self.submit()
        return AttemptResult(exit_code=code, duration_ms=duration, submitted=submitted, usage=usage)

    def supervise(self, process: subprocess.Popen[bytes], began: float) -> tuple[str, str] | None:
        """Read the agent's output to its end; (reason, detail) when the attempt had to be ended.

        A token or cost limit is often crossed by the agent's last report, as it ends: an agent that
        crossed one is given LIMIT_GRACE_SECONDS to end by itself (its work is then submitted as any
        other) before it is killed."""
        deadline = began + self.spec.timeout_seconds
        assert process.stdout is not None
        descriptor = process.stdout.fileno()
        pending = b""
        crossed: tuple[float, tuple[str, str]] | None = None
        try:
            with selectors.DefaultSelector() as selector:
                selector.register(descriptor, selectors.EVENT_READ)
                while True:
                    now = time.monotonic()
                    if self.stop is not None:
                        return self.stop
                    if now >= deadline:
                        return self.spec.timeout_reason, self.timeout_detail()
                    crossed = crossed or ((now, limit) if (limit := self.limit_crossed()) else None)
                    if crossed is not None and now - crossed[0] >= LIMIT_GRACE_SECONDS:
                        return crossed[1]
                    if not selector.select(POLL_SECONDS):
                        if process.poll() is not None:
                            break  # exited; a stray child of its group still holds the output open
                        continue
                    chunk = os.read(descriptor, READ_CHUNK)
                    if not chunk:
                        break
                    self.out.write(chunk)
                    self.out.flush()
                    pending = self.take_lines(pending + chunk)
            if pending:
                self.take_line(pending)
            while process.poll() is None:  # its output closed; the agent itself is ending
                if self.stop is not None:
                    return self.stop
                if time.monotonic() >= deadline:
                    return self.spec.timeout_reason, self.timeout_detail()
                time.sleep(POLL_SECONDS / 5)
            return None
        finally:
            kill_group(process)  # whatever the agent left running in its group goes with it
            process.stdout.close()

    def take_lines(self, data: bytes) -> bytes:
        *lines, rest = data.split(b"\n")
        for line in lines:
            self.take_line(line)
        return rest if len(rest) <= MAX_LINE else b""

    def take_line(self, line: bytes) -> None:
        if line.strip() and self.reader.feed(line):
            write_atomically(self.spec.progress_path, msgspec.json.encode(self.reader.usage()))

    def limit_crossed(self) -> tuple[str, str] | None:
        usage = self.reader.usage()
        spent_tokens = (usage.tokens_in or 0) + (usage.tokens_out or 0)
        if self.spec.max_tokens is not None and spent_tokens >= self.spec.max_tokens:
            return "budget", f"the attempt reached its token limit of {self.spec.max_tokens} ({spent_tokens} reported)"
        if self.spec.max_cost_usd is not None and (usage.cost_usd or 0.0) >= self.spec.max_cost_usd:
            return "budget", (f"the attempt reached its cost limit of ${self.spec.max_cost_usd:.2f} "
                              f"(${usage.cost_usd:.4f} reported)")
        return None

    def timeout_detail(self) -> str:
        return self.spec.timeout_detail or f"the attempt ran past its {self.spec.timeout_seconds:g}s wall-clock limit"

    def submit(self) -> bool:
        """`lanes-es task submit` in the Lane, when its task still waits for a delivery; True when it is delivered."""
        from lanes_es.adapters.kernel import ReferenceKernel
        from lanes_es.ports import KernelError

        try:
            status = ReferenceKernel().status(self.spec.lane)
        except (KernelError, OSError) as error:
            self.out.write(f"--- lanes-es: the task's status cannot be read, nothing submitted: {error}\n".encode())
            return False
        if status.artifact_state == "frozen":
            return True  # the agent submitted it itself
        if status.lifecycle != "active" or status.next_obligation != "submit_assurance":
            return False
        self.out.write(f"--- lanes-es: {' '.join(self.spec.submit_argv[-2:])}\n".encode())
        self.out.flush()
        try:
            done = subprocess.run(self.spec.submit_argv, cwd=self.spec.lane, stdin=subprocess.DEVNULL,
                                  stdout=self.out, stderr=subprocess.STDOUT, timeout=SUBMIT_SECONDS)
        except (OSError, subprocess.TimeoutExpired) as error:
            self.out.write(f"--- lanes-es: task submit failed: {error}\n".encode())
            return False
        return done.returncode == 0


def elapsed_ms(began: float) -> int:
    return int(round((time.monotonic() - began) * 1000))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m lanes_es.executors.attempt SPEC_FILE (the autopilot starts this)", file=sys.stderr)
        return 2
    spec = msgspec.json.decode(Path(argv[0]).read_bytes(), type=AttemptSpec)
    attempt = Attempt(spec)
    signal.signal(signal.SIGTERM, attempt.request_stop)
    signal.signal(signal.SIGINT, attempt.request_stop)
    result = attempt.run()
    write_atomically(spec.result_path, msgspec.json.encode(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
