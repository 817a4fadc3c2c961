"""The one base class of everything a user can cause and fix.

A `Refusal` reaching the command line is printed as its one-line message and exits 2
(`lanes_es/exit_codes.py`); anything else that escapes is an internal error (exit 70).
Its message names the thing, the cause and the next command to run.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    from pathlib import Path


class Refusal(Exception):
    """Refused or bad input: nothing was written but its audit event; the message says what to do next."""


class ServiceError(Refusal):
    """A use case refused (lanes_es/usecases/): `code` is stable, the message says what to do next."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.detail = message


@contextmanager
def naming(path: str | Path) -> Iterator[None]:
    """A write to `path` that fails (a full disk) raises without a file name; give it this one."""
    try:
        yield
    except OSError as error:
        if error.filename is None and error.errno is not None:
            raise OSError(error.errno, error.strerror, str(path)) from None
        raise
