"""Identifiers and timestamps shared by every part of the domain.

Upstream's patterns and canonical forms, kept in one place so that a task id or
a timestamp means the same thing to the parser, the validator and the store.
"""

from __future__ import annotations

import functools
import re
from datetime import datetime, timezone

TASK_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
CANONICAL_TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")

RECORD_CONTRACT = "assurance_kernel/batch_run_state/v2"
REPORT_CONTRACT = "assurance_kernel/batch_run_report/v1"
LANE_EXECUTOR_HOSTS = ("claude-code", "pi")


def is_valid_id(value: object) -> bool:
    """A task id, slice id, slug or batch id as upstream accepts them."""
    return isinstance(value, str) and TASK_ID_PATTERN.fullmatch(value) is not None


def lane_branch_name(initiative_slug: str, task_id: str) -> str:
    """The branch a child's Lane must sit on."""
    return f"imm-lane/{initiative_slug}/{task_id}"


def batch_branch_name(initiative_slug: str) -> str:
    return f"imm/{initiative_slug}"


def format_timestamp(moment: datetime) -> str:
    """Canonical `YYYY-MM-DDTHH:MM:SS.mmmZ`, as JavaScript's toISOString prints."""
    moment = moment.astimezone(timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def parse_timestamp(text: str) -> datetime:
    """The aware datetime of a canonical timestamp; ValueError when it is not one."""
    if not is_canonical_timestamp(text):
        raise ValueError(f"not a canonical timestamp: {text!r}")
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)


def is_canonical_timestamp(value: object) -> bool:
    """Matches the pattern and round-trips through ISO formatting (no 25:00, no Feb 30)."""
    return isinstance(value, str) and _is_canonical(value)


@functools.lru_cache(maxsize=4096)
def _is_canonical(value: str) -> bool:
    # Cached: a replay checks the same few timestamps after every event, and strptime is slow.
    if CANONICAL_TIMESTAMP.fullmatch(value) is None:
        return False
    try:
        moment = datetime.strptime(value, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)
    except ValueError:
        return False
    return format_timestamp(moment) == value
