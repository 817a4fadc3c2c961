"""Reading what a process shows on a pseudo-terminal, for tests of what a person sees."""

from __future__ import annotations

import os
import select
import subprocess


def read_terminal(master: int, process: subprocess.Popen[bytes]) -> str:
    """Everything the process wrote to the terminal whose other end is `master`, until it closes it."""
    received = bytearray()
    try:
        while True:
            if not select.select([master], [], [], 120)[0]:  # a guard against a hung child, not a timing check
                process.kill()
                raise AssertionError(f"no output on the terminal for 120 s; it had shown {bytes(received)[-400:]!r}")
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the process closed its end of the terminal
                break
            if not chunk:
                break
            received += chunk
    finally:
        os.close(master)
    return received.decode("utf-8", "replace")
