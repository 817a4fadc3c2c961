"""What every runner of non-git processes shares: starting a command in its own session, ending it and
everything it started, and ending them all when lanes-es is interrupted.

A command leads its own session so that its whole tree can be killed (a timeout, too much output). The
terminal's Ctrl-C then does not reach it, so lanes-es ends it itself: every group started here is known
from the moment it exists (an interrupt is held while the child starts), and `groups_ended_on_interrupt`
kills them all when SIGINT arrives, before the KeyboardInterrupt unwinds (a thread pool waiting on its
checks would otherwise wait for them to end on their own, up to their timeout).

A check also ends with the process that started it when that process is killed outright (SIGKILL, an
out-of-memory kill: no handler runs). Its leader gets the kernel's parent-death signal (SIGKILL; set by
setpriv where the system has it, see `start_tied_group`), and its
group is recorded in the temporary directory under the process that owns it, as are the temporary trees
it runs in (`lanes-es-candidate-*`, `lanes-es-qa-home-*`, `lanes-es-qa-tree-*`, named after their
owner); the next lanes-es process that starts a check, or an autopilot, first ends what is left of the
groups of owners that are gone (the leader's children, which the kernel does not signal) and removes
their trees.
"""

from __future__ import annotations

import atexit
import errno
import os
import re
import shutil
import signal
import subprocess
import tempfile
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


def start_check(argv: list[str], **popen_args: Any) -> subprocess.Popen[bytes]:
    """`start_group` for a check lanes-es waits for: it ends with this process, even one killed outright (its
    leader by the parent-death signal, what it started by the next lanes-es that starts a check)."""
    reap_abandoned_once()
    process = start_tied_group(argv, **popen_args)
    _record(process)
    return process


def start_tied_group(argv: list[str], **popen_args: Any) -> subprocess.Popen[bytes]:
    """`start_group` whose leader the kernel kills (SIGKILL) when the thread that started it dies: a supervisor
    killed outright never leaves its command running unsupervised (past its limits). Start it from a thread
    that lives as long as it waits for the command.

    The parent-death signal is set by util-linux's `setpriv --pdeathsig KILL`, which then execs the command
    (the kernel keeps the signal across exec), where the machine has it: Python starts a child without a
    `preexec_fn` with vfork, which does not copy the parent's page tables. A coordinator or a Ray node's host
    is a large, threaded process: from a 150 MB one, a fork with a `preexec_fn` cost 7 ms of its CPU per
    command, against 0.4 ms through setpriv; in `lanes-es bench integration --k 8 --verify-workers 36` the
    35 candidate checks' Popen calls took 76 ms median, against 25 ms.
    Without it, the child runs `_ends_with` before its exec, as before. The program is looked up here, so a
    missing one is an OSError as from Popen; one the kernel cannot execute (a file without a `#!` line) fails
    in setpriv, which says so in the command's output and exits 126. A thread that dies in the instant
    between setpriv's start and its prctl leaves a check to the next lanes-es's reaper (below)."""
    trampoline = _pdeathsig_trampoline()
    if trampoline is not None:
        return start_group([*trampoline, _executable(argv[0], popen_args), *argv[1:]], **popen_args)
    return start_group(argv, preexec_fn=_ends_with(os.getpid()), **popen_args)


def _executable(program: str, popen_args: dict[str, Any]) -> str:
    """`program` as Popen would find it (on the PATH of the environment it is given; a path with a slash from the
    child's directory); OSError as Popen raises it when it is missing or not executable, so that a command that
    cannot start is told the same way through the trampoline."""
    if "/" not in program:
        found = shutil.which(program, path=os.pathsep.join(os.get_exec_path(popen_args.get("env"))))
        if found is None:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)
        return found
    where = os.path.join(popen_args.get("cwd") or "", program)
    if not os.path.exists(where):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)
    if os.path.isdir(where) or not os.access(where, os.X_OK):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), program)
    return program


_TRAMPOLINE: list[list[str] | None] = []
# Where setpriv is looked up: the system's own directories, never the user's or a check's PATH.
SYSTEM_PATH = "/usr/bin:/bin:/usr/sbin:/sbin"


def _pdeathsig_trampoline() -> list[str] | None:
    """`setpriv --pdeathsig KILL --`, when this system's setpriv takes that option (util-linux 2.33 and later);
    looked up once."""
    if not _TRAMPOLINE:
        found = shutil.which("setpriv", path=SYSTEM_PATH)
        trampoline = [found, "--pdeathsig", "KILL", "--"] if found else None
        if trampoline is not None:
            try:
                probe = subprocess.run([*trampoline, "true"], stdin=subprocess.DEVNULL, capture_output=True,
                                       timeout=10, env={"PATH": SYSTEM_PATH})
                trampoline = trampoline if probe.returncode == 0 else None
            except (OSError, subprocess.TimeoutExpired):
                trampoline = None
        _TRAMPOLINE.append(trampoline)
    return _TRAMPOLINE[0]


def kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL the command's whole process group (it leads its own session), then reap it."""
    _signal_group(process)
    process.wait()
    forget_group(process)


def forget_group(process: subprocess.Popen[bytes]) -> None:
    """The command ended by itself and was reaped: its group is no longer ours to end (its pid may be reused)."""
    with STARTED.lock:
        STARTED.running.discard(process)
    record = getattr(process, "_lanes_es_record", None)
    if record is not None:
        try:
            os.unlink(record)
        except OSError:
            pass


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


# ---------------------------------------------------------------- what a process killed outright leaves


TREE_KINDS = ("candidate", "qa-home", "qa-tree")
_TREE_NAME = re.compile(r"lanes-es-(?:candidate|qa-home|qa-tree)-(\d+\.\d+)-.*")
_PR_SET_PDEATHSIG = 1
_PRCTL: list[Any] = []  # libc's prctl, looked up once (None where there is none)
_REAPED: list[bool] = []
_OWN: list[tuple[int, str | None]] = []


def tree_prefix(kind: str) -> str:
    """The prefix of a temporary tree of `kind` (TREE_KINDS) this process owns: its owner is in its name
    (without /proc, where no owner can be told alive, the plain prefix, and no tree is ever removed)."""
    assert kind in TREE_KINDS
    owner = _own_token()
    return f"lanes-es-{kind}-{owner}-" if owner else f"lanes-es-{kind}-"


def _own_token() -> str | None:
    """This process's owner token, read once (again in a child made by fork: its pid differs)."""
    pid = os.getpid()
    if not _OWN or _OWN[0][0] != pid:
        _OWN[:] = [(pid, owner_token(pid))]
    return _OWN[0][1]


def owner_token(pid: int) -> str | None:
    """`<pid>.<start time>`: a process, told apart from a later one given the same pid."""
    started = _start_time(pid)
    return None if started is None else f"{pid}.{started}"


def _start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot, /proc's field 22); None when it is gone (or a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else fields[19]


def _alive(token: str) -> bool:
    pid, _, _ = token.partition(".")
    return pid.isdigit() and owner_token(int(pid)) == token


def _registry() -> str:
    return os.path.join(tempfile.gettempdir(), f"lanes-es-checks-{os.getuid()}")


def _record(process: subprocess.Popen[bytes]) -> None:
    """Note the check's group under this process, until it is ended and reaped (`forget_group`)."""
    owner, leader = _own_token(), owner_token(process.pid)
    if owner is None or leader is None:
        return  # no /proc: the parent-death signal is all there is
    folder = os.path.join(_registry(), owner)
    try:
        if not os.path.isdir(folder):
            os.makedirs(folder, mode=0o700, exist_ok=True)
            atexit.register(_forget_owner, folder)
        path = os.path.join(folder, leader)
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    except OSError:
        return  # an unwritable temporary directory: the check runs as before, without its record
    process._lanes_es_record = path  # type: ignore[attr-defined]


def _forget_owner(folder: str) -> None:
    """At a normal exit: this process's records (its checks are ended and reaped by then), and the registry
    when no other process has any, so that nothing is left in the temporary directory."""
    shutil.rmtree(folder, ignore_errors=True)
    try:
        os.rmdir(os.path.dirname(folder))
    except OSError:
        pass  # another process's records are there


def _ends_with(parent: int) -> Callable[[], None]:
    """What the check's child runs before its program: SIGKILL when the thread that started it dies (the kernel
    keeps it across exec), and exit at once when that already happened."""
    if not _PRCTL:
        try:
            import ctypes

            _PRCTL.append(ctypes.CDLL(None, use_errno=True).prctl)
        except (OSError, AttributeError):
            _PRCTL.append(None)
    prctl = _PRCTL[0]

    def in_child() -> None:
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:
            os._exit(137)

    return in_child


def reap_abandoned_once() -> None:
    """`reap_abandoned`, the first time this process asks."""
    with STARTED.lock:
        if _REAPED:
            return
        _REAPED.append(True)
    reap_abandoned()


def reap_abandoned() -> None:
    """End what is left of the checks of lanes-es processes that are gone, then remove their temporary trees.
    Only where /proc tells which owners are alive."""
    if _own_token() is None:
        return
    registry = _registry()
    for owner in _listdir(registry):
        if _alive(owner):
            continue
        folder = os.path.join(registry, owner)
        for leader in _listdir(folder):
            _end_abandoned(leader)
        shutil.rmtree(folder, ignore_errors=True)
    try:
        os.rmdir(registry)  # when no process has records left
    except OSError:
        pass
    base = tempfile.gettempdir()
    for entry in _listdir(base):
        found = _TREE_NAME.fullmatch(entry)
        if found is not None and not _alive(found.group(1)):
            shutil.rmtree(os.path.join(base, entry), ignore_errors=True)


def _end_abandoned(leader: str) -> None:
    """SIGKILL the group the recorded leader led. Its pid cannot be given to a new process while the group
    lives, so the group is the check's own unless a new process holds that pid (then it ended long ago)."""
    pid, _, _ = leader.partition(".")
    if not pid.isdigit() or int(pid) <= 1:
        return
    current = owner_token(int(pid))
    if current is not None and current != leader:
        return
    try:
        os.killpg(int(pid), signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _listdir(directory: str) -> list[str]:
    try:
        return os.listdir(directory)
    except OSError:
        return []


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
                keep_stderr: int, env: dict[str, str] | None = None,
                started: Callable[[subprocess.Popen[bytes]], None] | None = None) -> tuple[int, Captured, Captured]:
    """Run a user's command (no shell, its own process group) and read stdout and stderr to their end, keeping
    only bounded heads: a command that writes gigabytes costs time (up to `timeout`), never memory. `started`
    is handed the process once it runs (to signal it from another thread).
    Raises OSError when it cannot start, subprocess.TimeoutExpired (its group killed) when it outlives `timeout`."""
    import selectors
    import time

    deadline = time.monotonic() + timeout
    out, err = Captured(keep_stdout), Captured(keep_stderr)
    process = start_check(argv, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE)
    if started is not None:
        started(process)
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
