"""What this machine last anchored of a batch's log: `<git common dir>/lanes-es/anchored/anchored-<batch_id>`.

The checkpoint writes it after each signed checkpoint (lanes_es/adapters/anchor_git.py, which reads it
back to anchor only what a tick appended): the size anchored and the chain digest of the event at that
size. The store reads it before it hands out a batch's log (`anchored_tip`): a log shorter than that
size was cut, and one whose event at that size carries another digest was rewritten, after it was
anchored. Kept free of the audit modules: every command that reads a batch reads this.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from .files import MiB, FileTooLarge, read_capped

# The state kept of the log last anchored grows with the batch's integrations; a marker past this is no marker
# lanes-es wrote.
MAX_MARKER_BYTES = 64 * MiB


def anchored_dir(common_dir: Path) -> Path:
    """Where a repository keeps its markers: beside its store, in the git common dir shared by its worktrees."""
    return common_dir / "lanes-es" / "anchored"


def marker_path(state_dir: Path, batch_id: str) -> Path:
    return state_dir / f"anchored-{batch_id}"


def read_marker(state_dir: Path, batch_id: str) -> bytes | None:
    """The marker's bytes; None when there is none (never anchored here), it cannot be read, or it is larger than
    any marker lanes-es writes (then the checkpoint reads the whole log, as without one)."""
    try:
        return read_capped(marker_path(state_dir, batch_id), MAX_MARKER_BYTES)
    except (OSError, FileTooLarge):
        return None


def anchored_tip(state_dir: Path, batch_id: str) -> tuple[int, str] | None:
    """(size anchored, chain digest of the event at that size; "" in a marker that kept the size alone), or
    None when nothing readable was anchored here."""
    data = read_marker(state_dir, batch_id)
    if data is None:
        return None
    try:
        fields = msgspec.json.decode(data)
    except msgspec.DecodeError:
        return None
    if isinstance(fields, int) and not isinstance(fields, bool):  # a marker from before the state was kept
        return (fields, "") if fields > 0 else None
    if not isinstance(fields, dict):
        return None
    size, digest = fields.get("size"), fields.get("digest", "")
    if not isinstance(size, int) or isinstance(size, bool) or size <= 0 or not isinstance(digest, str):
        return None
    return size, digest
