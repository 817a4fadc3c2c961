"""The command line's last line of defence: every error becomes one line and a code of the table.

What a user can cause and fix is a `Refusal` (exit 2) or a file-system condition named by its
path (a full disk, a read-only directory, a missing file: exit 2), or a PostgreSQL role without the grants
the command needs (exit 2, naming the store and what to grant), or a PostgreSQL server that ended the
connection or does not answer (exit 2, an outage naming the server); a closed output pipe ends
quietly (141, as git); Ctrl-C is 130; anything else is an internal error (70), said as such.
"""

from __future__ import annotations

import errno
import os
import sys
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from lanes_es.adapters.processes import groups_ended_on_interrupt
from lanes_es.adapters.store_open import outage_refusal, privilege_refusal
from lanes_es.errors import Refusal
from lanes_es.exit_codes import EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_PIPE_CLOSED, EXIT_REFUSED

# File-system conditions of the user's machine, not of lanes-es: a message and exit 2.
USER_ERRNOS = {
    errno.ENOSPC: "the disk is full; free some space and run the command again",
    errno.EDQUOT: "the disk quota is used up; free some space and run the command again",
    errno.EROFS: "the file system is read-only; use a writable place (--root, --store, -o)",
    errno.EACCES: "permission denied; fix its owner or mode (or use another path), then run the command again",
    errno.EPERM: "operation not permitted; check the owner and mode of the path, or use another one",
    errno.ENOENT: "no such file or directory; check the path",
    errno.ENOTDIR: "a part of the path is a file, not a directory; check the path",
    errno.EISDIR: "it is a directory, not a file; name a file",
    errno.EEXIST: "it already exists; name a new path or remove it first",
    errno.ENAMETOOLONG: "the name is too long; use a shorter path",
    errno.EMFILE: "too many open files; raise the limit (ulimit -n) and run the command again",
}


def run_guarded(command: Callable[[], Any], prefix: str = "lanes-es") -> int:
    """Run `command` and turn what escapes it into a line on stderr and an exit code of the table."""
    real_stdout = sys.stdout
    sys.stdout = NamedOutput(real_stdout)
    try:
        with groups_ended_on_interrupt():  # the checks it started lead their own sessions: Ctrl-C ends them too
            code = int(command() or 0)
        sys.stdout.flush()  # a full disk or a closed pipe shows here, not after the exit code is chosen
        return code
    except BrokenPipeError:
        _drop_stdout()
        return EXIT_PIPE_CLOSED
    except Refusal as error:
        return _say(f"{prefix}: {error}", EXIT_REFUSED)
    except KeyboardInterrupt:
        return _say(f"{prefix}: interrupted; the log keeps every step already taken, run the command again to go on",
                    EXIT_INTERRUPTED)
    except OSError as error:
        if error.errno in USER_ERRNOS:
            line = f"{prefix}: {describe_os_error(error)}"
            if error.filename == STDOUT_NAME:
                _drop_stdout()
            return _say(line, EXIT_REFUSED)
        return _internal(prefix, error)
    except Exception as error:  # noqa: BLE001 - the last line of defence says what happened
        # a PostgreSQL role without the grants a command needs, or a server that ended the connection
        refused = privilege_refusal(error) or outage_refusal(error)
        if refused is not None:
            return _say(f"{prefix}: {refused}", EXIT_REFUSED)
        return _internal(prefix, error)
    finally:
        sys.stdout = real_stdout


def describe_os_error(error: OSError) -> str:
    """`cannot use PATH: cause; what to do`, naming stdout when no path is known."""
    return f"cannot use {_culprit(error)}: {USER_ERRNOS.get(error.errno, error.strerror or 'failed')}"


def _culprit(error: OSError) -> str:
    """The path of the error (stdout's writes are named by `NamedOutput`)."""
    return str(error.filename) if error.filename is not None else "a file being written"


STDOUT_NAME = "the output (stdout)"


class NamedOutput:
    """stdout, whose write errors (a full disk) carry its name as their file name."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    @property
    def buffer(self) -> Any:
        return NamedOutput(self._stream.buffer)

    def write(self, data: Any) -> int:
        with _named_stdout():
            return self._stream.write(data)

    def flush(self) -> None:
        with _named_stdout():
            self._stream.flush()


@contextmanager
def _named_stdout() -> Iterator[None]:
    try:
        yield
    except BrokenPipeError:
        raise
    except OSError as error:
        if error.filename is None:
            error.filename = STDOUT_NAME
        raise


def _drop_stdout() -> None:
    """stdout cannot take more (`| head`, /dev/full): point it at /dev/null so Python's flush at exit is quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _say(line: str, code: int) -> int:
    try:
        print(line, file=sys.stderr)
    except OSError:
        pass
    return code


def _internal(prefix: str, error: BaseException) -> int:
    return _say(f"{prefix}: internal error (a bug in lanes-es, exit {EXIT_INTERNAL}): "
                f"{type(error).__name__}: {error}", EXIT_INTERNAL)
