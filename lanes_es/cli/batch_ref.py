"""A batch named as a user names it: the Initiative's slug, the batch id, or a unique prefix of the id (as git
takes a short commit id)."""

from __future__ import annotations

from typing import Any

from lanes_es.domain.ids import is_valid_id
from lanes_es.errors import Refusal


class BatchNotNamed(Refusal):
    """No batch, or more than one, answers to the name."""


def resolve_batch_id(store: Any, name: str) -> str:
    """The batch id `name` stands for in this repository's store, or a refusal naming what to give instead."""
    if not is_valid_id(name):
        raise BatchNotNamed(f"invalid_input: {name!r} names no batch; give an Initiative's slug, a batch id or a "
                            f"unique prefix of one (`lanes-es batches` lists them)")
    if store.stored_events(name):
        return name
    initiative = store.initiative(name)
    if initiative is not None and initiative.batch_ids():
        current = initiative.current
        batch_id = current.batch_id if current is not None else initiative.batch_ids()[-1]
        if not store.stored_events(batch_id):  # confirmed, never ticked: its log starts at its first tick
            raise BatchNotNamed(f"batch_not_started: batch {batch_id} of Initiative {name} is confirmed but not "
                                f"started: its log begins with the first `lanes-es tick {name}` (or "
                                f"`lanes-es run {name} ...`)")
        return batch_id
    found = [batch_id for batch_id in store.batch_ids() if batch_id.startswith(name)]
    if len(found) == 1:
        return found[0]
    if found:
        shown = ", ".join(sorted(found)[:5]) + (", ..." if len(found) > 5 else "")
        raise BatchNotNamed(f"ambiguous_batch: {name} is the start of {len(found)} batch ids ({shown}); give more "
                            f"of the id")
    raise BatchNotNamed(f"batch_not_found: the store has no batch {name}, no Initiative {name} with a batch, and no "
                        f"batch id starting so; `lanes-es batches` lists the batches")
