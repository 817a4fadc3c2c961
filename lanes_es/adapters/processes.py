"""What every runner of non-git processes shares: starting a command in its own session, ending it and
everything it started, and ending them all when lanes-es is interrupted.

A command leads its own session so that its whole tree can be killed (a timeout, too much output). The
terminal's Ctrl-C then does not reach it, so lanes-es ends it itself: every group started here is known
from the moment it exists (an interrupt is held while the child starts), and `groups_ended_on_interrupt`
kills them all when SIGINT arrives, before the KeyboardInterrupt unwinds (a thread pool waiting on its
checks would otherwise wait for them to end on their own, up to their timeout).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator


class _Started:
    """The command groups this process started and has not ended yet."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running: set[subprocess.Popen[bytes]] = set()
        self.ending = False  # set by an interrupt: a group that starts after it is ended at once


STARTED = _Started()


def start_group(argv: list[str], **popen_args: Any) -> subprocess.Popen[bytes]:
    """Popen `argv` leading its own session, known to the interrupt handler before an interrupt can reach
    this thread (raises OSError, as Popen, when it cannot start)."""
    with _interrupt_held():
        process = subprocess.Popen(argv, start_new_session=True, **popen_args)
        with STARTED.lock:
            STARTED.running.add(process)
            ending = STARTED.ending
    if ending:
        _signal_group(process)
    return process


def kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL the command's whole process group (it leads its own session), then reap it."""
    _signal_group(process)
    process.wait()
    with STARTED.lock:
        STARTED.running.discard(process)


def forget_group(process: subprocess.Popen[bytes]) -> None:
    """The command ended by itself and was reaped: its group is no longer ours to end (its pid may be reused)."""
    with STARTED.lock:
        STARTED.running.discard(process)


def end_started_groups() -> None:
    """SIGKILL every group started and not yet ended (their runners reap them), and any that starts later."""
    with STARTED.lock:
        STARTED.ending = True
        running = list(STARTED.running)
    for process in running:
        _signal_group(process)


@contextmanager
def groups_ended_on_interrupt() -> Iterator[None]:
    """For a command's duration, SIGINT ends every started group, then raises KeyboardInterrupt as before.
    Outside the main thread (a test's, an embedding's) signals are not ours to handle: nothing changes."""

    def interrupted(signum: int, frame: Any) -> None:
        end_started_groups()
        raise KeyboardInterrupt

    try:
        with _sigint_handled_by(interrupted):
            yield
    finally:
        with STARTED.lock:
            STARTED.ending = False


@contextmanager
def _interrupt_held() -> Iterator[None]:
    """Hold SIGINT while a child starts and is recorded, then deliver it: raised inside Popen, after the
    fork, the interrupt would leave a child no one knows of."""
    held: list[Any] = []
    with _sigint_handled_by(lambda signum, frame: held.append(frame)) as previous:
        yield
    if held and callable(previous):
        previous(signal.SIGINT, held[0])
    elif held and previous != signal.SIG_IGN:
        raise KeyboardInterrupt


@contextmanager
def _sigint_handled_by(handler: Callable[[int, Any], None]) -> Iterator[Any]:
    """SIGINT goes to `handler` inside the block and to the handler before it after; yields that one. Only
    the main thread receives Python's signals (and may set them): elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield None
        return
    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield previous
    finally:
        signal.signal(signal.SIGINT, previous)


def _signal_group(process: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def process_alive(pid: int) -> bool:
    """Whether `pid` is a live process of this machine (a zombie, dead but not yet reaped, is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, another user's
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True  # no /proc to ask: kill(0) said it is there


class Captured:
    """One output stream of a command, read to its end with bounded memory: the first `keep` bytes, and the
    length and sha256 of everything it wrote (so a truncated excerpt still names the whole)."""

    def __init__(self, keep: int) -> None:
        import hashlib

        self.keep = keep
        self.head = b""
        self.size = 0
        self._digest = hashlib.sha256()

    def add(self, chunk: bytes) -> None:
        self._digest.update(chunk)
        self.size += len(chunk)
        if len(self.head) < self.keep:
            self.head += chunk[:self.keep - len(self.head)]

    @property
    def truncated(self) -> bool:
        return self.size > len(self.head)

    @property
    def sha256(self) -> str:
        return self._digest.hexdigest()

    def excerpt(self, limit: int) -> str:
        """At most `limit` characters of what was kept; when anything was left out, how much and its sha256."""
        text = self.head.decode("utf-8", "replace").strip()
        if len(text) <= limit and not self.truncated:
            return text
        return truncated_excerpt(text, limit, self.size, self.sha256)


def truncated_excerpt(text: str, limit: int, size: int, sha256: str) -> str:
    """The form a cut text takes in a message or the log: its first `limit` characters, then the length and
    sha256 of the whole, so the excerpt still names what it was cut from."""
    return f"{text[:limit]}... (truncated: {size} bytes, sha256 {sha256})"


def run_bounded(argv: list[str], cwd: str, stdin: bytes, timeout: float, keep_stdout: int,
                keep_stderr: int) -> tuple[int, Captured, Captured]:
    """Run a user's command (no shell, its own process group) and read stdout and stderr to their end, keeping
    only bounded heads: a command that writes gigabytes costs time (up to `timeout`), never memory.
    Raises OSError when it cannot start, subprocess.TimeoutExpired (its group killed) when it outlives `timeout`."""
    import selectors
    import time

    deadline = time.monotonic() + timeout
    out, err = Captured(keep_stdout), Captured(keep_stderr)
    process = start_group(argv, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert process.stdin is not None and process.stdout is not None and process.stderr is not None
        try:
            process.stdin.write(stdin)
            process.stdin.close()
        except BrokenPipeError:
            pass  # it did not read its request: its answer says so
        with selectors.DefaultSelector() as selector:
            selector.register(process.stdout.fileno(), selectors.EVENT_READ, out)
            selector.register(process.stderr.fileno(), selectors.EVENT_READ, err)
            while selector.get_map():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise subprocess.TimeoutExpired(argv, timeout)
                ready = selector.select(min(remaining, 0.1))
                if not ready and process.poll() is not None:
                    break  # exited, but a stray child of its group still holds an output open
                for key, _ in ready:
                    chunk = os.read(key.fd, 65536)
                    if chunk:
                        key.data.add(chunk)
                    else:
                        selector.unregister(key.fd)
        try:
            code = process.wait(timeout=max(deadline - time.monotonic(), 0.001))
        except subprocess.TimeoutExpired:
            raise subprocess.TimeoutExpired(argv, timeout) from None
    finally:
        kill_group(process)
        process.stdout.close()
        process.stderr.close()
    return code, out, err
