"""Files written so that a reader sees the old bytes or the new, never half of them, and read within a bound.

Every file lanes-es reads may be anything: a Lane's content, a path a user typed (`/dev/zero`), a
sparse file of terabytes. `read_capped` reads at most one byte past the limit the caller names, so
memory stays bounded whatever the file is.
"""

from __future__ import annotations

import os
import tempfile

from lanes_es.errors import Refusal

KiB, MiB = 1024, 1024 * 1024


class FileTooLarge(Refusal, ValueError):
    """A file held more than its reader takes; the message names it and the bound."""

    def __init__(self, path: str | os.PathLike[str], limit: int) -> None:
        super().__init__(f"input_too_large: {path} holds more than {size_text(limit)}, the most lanes-es reads of it; "
                         f"name the right file")
        self.path, self.limit = str(path), limit


def read_capped(path: str | os.PathLike[str], limit: int) -> bytes:
    """The bytes of `path` (a regular file, a device, a pipe: whatever opens), at most `limit` of them;
    FileTooLarge when it holds more, OSError as `open` raises it."""
    with open(path, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise FileTooLarge(path, limit)
    return data


def read_capped_text(path: str | os.PathLike[str], limit: int, encoding: str = "utf-8") -> str:
    """`read_capped`, decoded (UnicodeDecodeError as `bytes.decode` raises it)."""
    return read_capped(path, limit).decode(encoding)


def size_text(size: int) -> str:
    """A byte count as a person reads it: 64 KiB, 16 MiB, 100 bytes."""
    for unit, name in ((MiB, "MiB"), (KiB, "KiB")):
        if size >= unit and size % unit == 0:
            return f"{size // unit} {name}"
    return f"{size} bytes"


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
