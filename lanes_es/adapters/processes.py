"""What every runner of non-git processes shares: ending a command and everything it started."""

from __future__ import annotations

import os
import signal
import subprocess


def kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL the command's whole process group (it leads its own session), then reap it."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait()
