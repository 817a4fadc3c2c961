"""A system user for tests that must run something as someone other than root (`useradd`, once)."""

from __future__ import annotations

import shutil
import subprocess

import pytest


def ensure_system_user(name: str) -> None:
    """Make the system user `name` when it does not exist yet; skip the test when this machine cannot."""
    if shutil.which("useradd") is None or shutil.which("runuser") is None:
        pytest.skip(f"needs useradd and runuser (util-linux) to run as the non-root user {name}")
    if subprocess.run(["id", "-u", name], capture_output=True).returncode != 0:
        made = subprocess.run(["useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent",
                               "--shell", "/usr/sbin/nologin", name], capture_output=True, text=True)
        if made.returncode not in (0, 9):  # 9: made meanwhile by another worker
            pytest.skip(f"cannot make the test user {name}: {made.stderr.strip()}")
