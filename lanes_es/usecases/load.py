"""Loading the aggregates a use case decides on: an Initiative by slug, its active batch, a batch by id."""

from __future__ import annotations

from lanes_es.domain.batch import LaneBatch
from lanes_es.domain.events import BatchAuthorized
from lanes_es.domain.ids import is_valid_id
from lanes_es.domain.initiative import Initiative
from lanes_es.errors import ServiceError
from lanes_es.usecases.deps import Deps


def check_slug(slug: str) -> None:
    if not is_valid_id(slug):
        raise ServiceError("invalid_slug", f"initiative_slug {slug!r} is invalid: use letters, digits, '.', '_' or '-' "
                                           f"(at most 128, starting with a letter or digit)")


def initiative(deps: Deps, slug: str) -> Initiative | None:
    check_slug(slug)
    return deps.store.initiative(slug)


def current_authorization(deps: Deps, slug: str) -> BatchAuthorized | None:
    """The Initiative's current authorization (its active batch's), None when it has none."""
    found = initiative(deps, slug)
    return found.current if found else None


def active_batch(deps: Deps, slug: str) -> LaneBatch | None:
    current = current_authorization(deps, slug)
    return None if current is None else deps.store.batch(current.batch_id)


def batch(deps: Deps, batch_id: str) -> LaneBatch:
    if not is_valid_id(batch_id):
        raise ServiceError("invalid_batch_id", f"{batch_id!r} is not a batch id")
    found = deps.store.batch(batch_id)
    if found is None:
        raise ServiceError("batch_not_found", f"no batch {batch_id} in the store {deps.store.shown_url}; "
                                              f"`lanes-es status` lists the Initiative's batches")
    return found
