"""`StoreHistory`: the IntegrationHistory port on the event store: how the Initiative's earlier batches
integrated, for the adaptive mode's choice (lanes_es/domain/adaptive.py)."""

from __future__ import annotations

from typing import Any

from lanes_es.domain.adaptive import HISTORY, integration_outcomes

EARLIER_BATCHES = 8  # the most of them read: enough Lanes for the estimate, a bounded read


class StoreHistory:
    def __init__(self, store: Any) -> None:
        self.store = store

    def earlier_outcomes(self, initiative_slug: str, batch_id: str) -> tuple[list[bool], list[str]]:
        """Newest first: the integration outcomes of the Initiative's batches before `batch_id` (at most
        HISTORY Lanes), and the ids of the batches they came from."""
        initiative = self.store.initiative(initiative_slug)
        earlier = [found for found in (initiative.batch_ids() if initiative else []) if found != batch_id]
        outcomes: list[bool] = []
        batches: list[str] = []
        for earlier_id in reversed(earlier[-EARLIER_BATCHES:]):
            if len(outcomes) >= HISTORY:
                break
            batch = self.store.batch(earlier_id)
            found = integration_outcomes(batch.record) if batch is not None else []
            if found:
                outcomes += found
                batches.append(earlier_id)
        return outcomes[:HISTORY], batches
