"""Which repository a command runs in, against the one the confirmation was given in (pure)."""

from __future__ import annotations

import pytest

from lanes_es.domain.drift import REPOSITORY_CHANGED, decide_repository
from lanes_es.domain.repository import RepositoryIdentity

CONFIRMED = RepositoryIdentity(repository_id="a" * 32, checkout="/work/project")


@pytest.mark.parametrize("here", [CONFIRMED, RepositoryIdentity(repository_id=None, checkout="/work/project")])
def test_the_confirmed_checkout_goes_on(here):
    assert decide_repository(CONFIRMED, here, shared_store=True) is None


def test_a_copy_keeps_the_id_but_is_another_checkout():
    drift = decide_repository(CONFIRMED, RepositoryIdentity(repository_id="a" * 32, checkout="/work/copy"), True)
    assert drift is not None and drift.code == REPOSITORY_CHANGED
    assert drift.detail == "this checkout /work/copy is not the repository the batch was confirmed in (/work/project)"


def test_another_clone_at_the_same_path_is_another_repository():
    """Re-cloned where the old one was: the path matches, the repository id does not."""
    drift = decide_repository(CONFIRMED, RepositoryIdentity(repository_id="b" * 32, checkout="/work/project"), True)
    assert drift is not None and drift.code == REPOSITORY_CHANGED
    assert "another clone" in drift.detail and "b" * 32 in drift.detail and "a" * 32 in drift.detail


def test_the_checkouts_own_store_and_an_authorization_without_a_repository_are_not_judged():
    elsewhere = RepositoryIdentity(repository_id="b" * 32, checkout="/work/copy")
    assert decide_repository(CONFIRMED, elsewhere, shared_store=False) is None
    assert decide_repository(None, elsewhere, shared_store=True) is None
