"""The flake policy's one rule (pure): which failed checks on a candidate may run again.

Only a check that existed before the Lane, unchanged: its acceptance item, same id and same
verification text, in the task's intent at the Lane's base. A check the Lane added or changed
never gets a second chance: its failure may be the Lane's own doing.
"""

from __future__ import annotations

from typing import Any


def rerunnable(failed: list[str], task_id: str, at_base: dict[str, Any] | None, on_candidate: dict[str, Any]) -> bool:
    """True when every failed finding id (`<task>:<item>`) names an item the base intent holds unchanged."""
    if not failed or at_base is None:
        return False
    before = _items(at_base)
    now = _items(on_candidate)
    for finding in failed:
        item_id = finding.split(":", 1)[1] if finding.startswith(f"{task_id}:") else None
        if item_id is None or item_id not in now or before.get(item_id) != now[item_id]:
            return False
    return True


def _items(intent: dict[str, Any]) -> dict[str, Any]:
    items = intent.get("acceptance") if isinstance(intent, dict) else None
    if not isinstance(items, list):
        return {}
    return {str(item.get("id")): item.get("verification") for item in items if isinstance(item, dict)}
