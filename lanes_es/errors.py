"""The one base class of everything a user can cause and fix.

A `Refusal` reaching the command line is printed as its one-line message and exits 2
(`lanes_es/exit_codes.py`); anything else that escapes is an internal error (exit 70).
Its message names the thing, the cause and the next command to run.
"""

from __future__ import annotations


class Refusal(Exception):
    """Refused or bad input: nothing was written but its audit event; the message says what to do next."""
