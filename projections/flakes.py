"""Checks that passed only on a rerun (the flake policy), counted across batches. Pure: a fold of logs."""

from __future__ import annotations

from typing import Any, Iterable

from lanes_es.domain import events as ev


def flaky_checks(logs: Iterable[tuple[str, list[Any]]]) -> list[dict[str, Any]]:
    """One row per finding id that failed on a candidate and then passed on a rerun: how often, in how many
    batches, and the last batch and candidate, most frequent first."""
    rows: dict[str, dict[str, Any]] = {}
    for batch_id, events in logs:
        for event in events:
            if not isinstance(event, ev.CandidateVerified):
                continue
            for check in event.checks:
                for finding in check.flaky:
                    row = rows.setdefault(finding, {"check": finding, "task_id": check.task_id, "passed_on_rerun": 0,
                                                    "batches": [], "last_candidate": None})
                    row["passed_on_rerun"] += 1
                    if batch_id not in row["batches"]:
                        row["batches"].append(batch_id)
                    row["last_candidate"] = event.commit
    return sorted(rows.values(), key=lambda row: (-row["passed_on_rerun"], row["check"]))
