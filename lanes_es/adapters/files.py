"""Writing a file so that a reader sees the old bytes or the new, never half of them."""

from __future__ import annotations

import os
import tempfile


def write_atomic(path: str | os.PathLike[str], data: bytes, staging_dir: str | os.PathLike[str],
                 mode: int = 0o600) -> None:
    """A temp file in `staging_dir` (same filesystem as `path`), synced, given `mode`, then renamed over `path`."""
    descriptor, temporary = tempfile.mkstemp(dir=staging_dir, prefix=".tmp-")
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        if os.path.lexists(temporary):
            os.unlink(temporary)
        raise


def unwritable_directory(directory: str | os.PathLike[str]) -> str | None:
    """The part of `directory` that stops a file being written into it by a rename (None: it can be): its nearest
    existing part must be a directory this user can write and enter (a file's own mode does not matter)."""
    place = os.path.abspath(directory)
    while not os.path.exists(place) and place != os.path.dirname(place):
        place = os.path.dirname(place)
    return None if os.path.isdir(place) and os.access(place, os.W_OK | os.X_OK) else place
