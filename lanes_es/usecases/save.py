"""After a decision: the events saved (the log first), the projections materialized from them, drift in
the projections repaired, and the signed checkpoint brought up to the log; and, before one, whether the
projections can be written at all."""

from __future__ import annotations

import time

from lanes_es.domain.batch import LaneBatch
from lanes_es.errors import ServiceError
from lanes_es.ports import PortError
from lanes_es.projections.batch import documents_of, drift, materialize
from lanes_es.usecases.deps import Deps
from lanes_es.usecases.stats import Timings


def save_and_materialize(deps: Deps, root: str, batch: LaneBatch) -> int:
    """Save the batch's new events, then write its projections under `root`; the events appended."""
    appended = deps.store.save(batch)
    materialize(root, documents_of(batch))
    return appended


def repair_drift(deps: Deps, root: str, batch: LaneBatch | None) -> list[str]:
    """A projection that differs from the log is rewritten from the log, and the drift reported."""
    if batch is None:
        return []
    documents = documents_of(batch)
    found = drift(root, documents)
    if not found:
        return []
    materialize(root, documents)
    for item in found:
        batch.note_drift(deps.now(), str(item.path))
    deps.store.save(batch)
    return [item.describe() for item in found]


def anchor(deps: Deps, root: str, batch: LaneBatch | None, timings: Timings | None = None) -> str | None:
    """After the log is saved: the signed checkpoint and attestations in git, outside the store.

    Never raises for a condition a user can fix: the events stand, and the next tick
    (or `verify`, which says the checkpoint is behind) picks it up. Returns why it was not brought up.
    """
    anchor_log = getattr(deps.adapters, "anchor_log", None)
    if anchor_log is None or batch is None or batch.version <= 0:
        return None
    # The audit modules (DSSE, Merkle, signed notes) are imported only by a tick that anchors: `status` never does.
    from lanes_es.audit.anchor import AnchorRefused
    from lanes_es.audit.signing import KeyError_

    began = time.perf_counter()
    try:
        anchor_log(root, batch.id, batch.version, lambda after: deps.store.stored_events(batch.id, after))
    except (AnchorRefused, KeyError_, PortError) as error:
        return str(error)
    finally:
        if timings is not None:
            timings.anchor += time.perf_counter() - began
    return None


def require_writable_state(root: str, command: str) -> None:
    """A command that writes a batch's state files refuses before it records anything when it could not."""
    from lanes_es.projections.files import unwritable_state_dir

    blocked = unwritable_state_dir(root)
    if blocked is not None:
        cause = "cannot be written by this user" if blocked.is_dir() else "is a file, not a directory"
        raise ServiceError("state_not_writable",
                           f"{blocked} {cause}, so the batch's state files (.imm/state/batches/) cannot be "
                           f"written; nothing was recorded: fix its owner or mode (chmod u+w {blocked}), or run "
                           f"as its owner, then run `lanes-es {command}` again")
