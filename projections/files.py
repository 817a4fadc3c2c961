"""The v2 state file and the lane report: upstream's paths and canonical bytes, written atomically.

These two documents are projections of a batch's log. They carry exactly upstream's
fields so that upstream's readers and its completion verifier can read them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lanes_es.adapters.files import unwritable_directory, write_atomic
from lanes_es.domain.ids import is_valid_id
from lanes_es.errors import naming

BATCHES_DIR = Path(".imm") / "state" / "batches"
MAX_DOCUMENT_BYTES = 256 * 1024 * 1024


class UnsafeBatchId(ValueError):
    pass


def canonical_bytes(document: Any) -> bytes:
    """Upstream's canonical form: 2-space JSON, keys in insertion order, then a newline."""
    return (json.dumps(document, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def _checked(batch_id: str) -> str:
    if not is_valid_id(batch_id):
        raise UnsafeBatchId("batch id is not a safe file identity")
    return batch_id


def state_path(root: str | Path, batch_id: str) -> Path:
    return Path(root) / BATCHES_DIR / f"{_checked(batch_id)}.json"


def report_path(root: str | Path, batch_id: str) -> Path:
    return Path(root) / BATCHES_DIR / f"{_checked(batch_id)}.report.json"


def read_bytes(path: Path) -> bytes | None:
    """The file's bytes, None when absent. A file larger than any document (a state file is about 0.4 KB a
    child) reads as its first MAX_DOCUMENT_BYTES + 1 bytes: that differs from every document, in bounded memory."""
    try:
        with open(path, "rb") as handle:
            return handle.read(MAX_DOCUMENT_BYTES + 1)
    except FileNotFoundError:
        return None


def write_atomically(path: Path, data: bytes) -> bool:
    """Write `data` unless the file already holds it, atomically (upstream's unchanged-bytes rule).

    Returns whether a write happened.
    """
    if read_bytes(path) == data:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.parent.is_dir():
        raise NotADirectoryError(f"{path.parent} is not a directory")
    try:
        with naming(path):  # a full disk fails the write or the fsync with no file name
            write_atomic(path, data, path.parent)
    except PermissionError as error:  # named by the directory, not by the temporary file that could not be made
        raise PermissionError(error.errno, error.strerror, str(path.parent)) from None
    return True


def unwritable_state_dir(root: str | Path) -> Path | None:
    """The part of `<root>/.imm/state/batches` that stops the state files being written (None: they can be).

    The nearest existing part of the path must be a directory this user can write and enter: the
    files are replaced by a rename in it, so their own mode does not matter."""
    blocked = unwritable_directory(Path(root) / BATCHES_DIR)
    return None if blocked is None else Path(blocked)
