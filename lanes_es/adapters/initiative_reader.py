"""Reading a Local Initiative carrier, `docs/initiatives/<slug>.md`, from the coordinator checkout."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from lanes_es.adapters.files import FileTooLarge, read_capped
from lanes_es.domain.ids import is_valid_id
from lanes_es.domain.initiative_file import parse_local_initiative
from lanes_es.domain.jstext import utf8_text
from lanes_es.ports import PortError

MAX_CARRIER_BYTES = 1024 * 1024


def carrier_path(slug: str) -> str:
    return f"docs/initiatives/{slug}.md"


def has_local_initiative(root: str, slug: str) -> bool:
    """Whether the carrier exists; a symlink or non-file there is refused, never followed."""
    path = Path(root) / carrier_path(slug)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(mode):
        raise PortError(f"Local Initiative {carrier_path(slug)} must be a regular file")
    return True


def read_local_initiative(root: str, slug: str) -> dict[str, Any]:
    """The carrier's observation (docs/upstream.md#the-local-initiative); PortError with upstream's message otherwise."""
    if not is_valid_id(slug):
        raise PortError("initiative_slug is invalid")
    relative = carrier_path(slug)
    if not has_local_initiative(root, slug):
        raise PortError(f"Local Initiative {relative} does not exist; write it first "
                        f"(## <slice-id>: <title>, a 'Tasks:' list with one task, optional 'Blocked by:'), or "
                        f"`lanes-es initiative new {slug}` and `lanes-es initiative add-task {slug} TASK ...`")
    path = Path(root) / relative
    for parent in path.relative_to(root).parents:
        if parent != Path(".") and (Path(root) / parent).is_symlink():
            raise PortError(f"Local Initiative {relative} must be a regular file")
    try:
        data = read_capped(path, MAX_CARRIER_BYTES)
    except FileTooLarge:
        raise PortError(f"Local Initiative {relative} is larger than {MAX_CARRIER_BYTES} bytes") from None
    try:
        text = utf8_text(data)
    except ValueError as error:
        raise PortError(f"Local Initiative {relative} {error}") from None
    try:
        return parse_local_initiative(text, slug, relative)
    except ValueError as error:
        empty = "declares no Slice" in str(error)  # upstream's text, and the way on
        raise PortError(str(error) + (f"; add its tasks with `lanes-es initiative add-task {slug} TASK ...`"
                                      if empty else "")) from None
