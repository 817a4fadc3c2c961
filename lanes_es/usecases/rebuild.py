"""`rebuild`: every projection of a batch recomputed from its log; with `check`, nothing written and the
drift returned. The log is folded as it is read, a page of rows at a time, so memory stays flat however
long it is; a log that does not verify is refused with the pointer to `lanes-es verify`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lanes_es.domain.ids import is_valid_id
from lanes_es.errors import ServiceError


def rebuild(store: Any, root: str | Path, batch_ids: list[str], *, check: bool) -> dict[str, list[str]]:
    """{batch id: the drift found (check) or the files written}; the projections are written under `root`."""
    from lanes_es.adapters.log_reader import stream_verified_events
    from lanes_es.projections.batch import drift, fold_documents, materialize

    found: dict[str, list[str]] = {}
    for batch_id in batch_ids:
        if not is_valid_id(batch_id):
            raise ServiceError("invalid_batch_id", f"{batch_id!r} is not a batch id")
        # checked as it streams: a log that does not verify is refused (DamagedLog), never written out as projections
        documents = fold_documents(stream_verified_events(store, batch_id))
        if documents is None:
            raise ServiceError("batch_not_found", f"no batch {batch_id} in the store {store.shown_url}; "
                                                  f"`lanes-es status` lists the Initiative's batches")
        if check:
            found[batch_id] = [item.describe() for item in drift(str(root), documents)]
        else:
            found[batch_id] = [str(path) for path in materialize(str(root), documents)]
    return found
