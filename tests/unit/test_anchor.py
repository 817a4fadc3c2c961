"""`anchor_log` over a fake checkpoint ref: when it signs, what it refuses to sign over, and how a
tick completes a checkpoint a crash left behind."""

from __future__ import annotations

from typing import Any, Sequence

import pytest

from lanes_es.adapters.store import EventStore
from lanes_es.audit.anchor import AnchorRefused, anchor_log
from lanes_es.audit.signed_note import Checkpoint
from lanes_es.audit.signing import Signer
from lanes_es.domain import events as ev
from lanes_es.domain.batch import LaneBatch

KEY = Signer.generate("lanes-es")
AT = "2026-01-01T00:00:00.000Z"


class FakeRef:
    def __init__(self) -> None:
        self.commits: list[dict[str, bytes]] = []
        self.remembered: Any = None
        self.reads = 0

    def read_checkpoint(self, root: str, batch_id: str, requests: Sequence[tuple[str, str | None]] = ()) -> Any:
        self.reads += 1
        described = {commit: ("tree-of-" + commit, None) for commit, _ in requests}
        if not self.commits:
            return None, None, described
        return str(len(self.commits)), self.commits[-1]["checkpoint"].decode(), described

    def describe(self, root: str, requests: Sequence[tuple[str, str | None]]) -> Any:
        return {commit: ("tree-of-" + commit, None) for commit, _ in requests}

    def write(self, root: str, batch_id: str, parent: str | None, files: dict[str, bytes], message: str) -> None:
        assert parent == (str(len(self.commits)) if self.commits else None)
        self.commits.append({**(self.commits[-1] if self.commits else {}), **files})

    def anchor_state(self, batch_id: str) -> Any:
        return self.remembered

    def save_anchor_state(self, batch_id: str, state: Any) -> None:
        self.remembered = state


@pytest.fixture
def store() -> Any:
    opened = EventStore("memory:")
    yield opened
    opened.close()


def batch_of(store: EventStore) -> LaneBatch:
    batch = LaneBatch.prepare(at=AT, batch_id="batch-x-1", initiative_slug="x", plan_digest="sha256:0",
                              base_head="a" * 40, branch="imm/x", confirmation_time=AT,
                              budget=ev.Budget(max_children=1, qa_failure_limit=2), max_parallel=1,
                              children=[ev.PlanChild(task_id="t", slice_id="S1", blocked_by=[])])
    batch.start(AT)
    store.save(batch)
    return batch


def anchor(ref: FakeRef, store: EventStore, batch: LaneBatch) -> Any:
    return anchor_log(ref, "/repo", batch.id, batch.version, lambda after: store.stored_events(batch.id, after), lambda: KEY)


def test_signs_the_whole_log_then_skips_until_it_grows(store):
    ref, batch = FakeRef(), batch_of(store)
    result = anchor(ref, store, batch)
    assert (result.size, result.previous_size) == (2, 0)
    assert Checkpoint.open(ref.commits[-1]["checkpoint"].decode(), KEY.verifier).size == 2
    reads = ref.reads
    assert anchor(ref, store, batch) is None and ref.reads == reads  # a quiet tick reads nothing
    batch.note_drift(AT, "p")
    store.save(batch)
    assert anchor(ref, store, batch).previous_size == 2 and len(ref.commits) == 2


def test_a_checkpoint_written_before_a_crash_is_adopted_not_written_again(store):
    ref, batch = FakeRef(), batch_of(store)
    anchor(ref, store, batch)
    ref.remembered = None  # the crash came between the git write and remembering it
    assert anchor(ref, store, batch) is None
    assert len(ref.commits) == 1 and ref.remembered.size == 2


def test_refuses_to_sign_over_a_log_that_no_longer_extends_its_checkpoint(store):
    ref, batch = FakeRef(), batch_of(store)
    anchor(ref, store, batch)
    other = EventStore("memory:")
    try:
        rewritten = LaneBatch.prepare(at=AT, batch_id="batch-x-1", initiative_slug="x", plan_digest="sha256:1",
                                      base_head="a" * 40, branch="imm/x", confirmation_time=AT,
                                      budget=ev.Budget(max_children=1, qa_failure_limit=2), max_parallel=1,
                                      children=[ev.PlanChild(task_id="t", slice_id="S1", blocked_by=[])])
        rewritten.start(AT)
        rewritten.note_drift(AT, "p")
        other.save(rewritten)
        with pytest.raises(AnchorRefused, match="rewritten"):
            anchor(ref, other, rewritten)
    finally:
        other.close()
    assert len(ref.commits) == 1


def test_refuses_a_checkpoint_signed_by_another_key(store):
    ref, batch = FakeRef(), batch_of(store)
    ref.commits.append({"checkpoint": Checkpoint(batch.id, 1, b"\0" * 32).sign(Signer.generate("lanes-es")).encode()})
    with pytest.raises(AnchorRefused, match="does not verify with the signing key"):
        anchor(ref, store, batch)


def test_a_tick_after_a_checkpoint_reads_and_hashes_only_the_events_it_appended(store):
    from lanes_es.audit import merkle
    from lanes_es.audit.anchor import log_leaves

    ref, batch = FakeRef(), batch_of(store)
    assert anchor(ref, store, batch).incremental is False  # the first reads the log whole
    reads: list[int] = []

    def read_rows(after: int) -> Any:
        reads.append(after)
        return store.stored_events(batch.id, after)

    for _ in range(3):
        batch.note_drift(AT, "p")
        store.save(batch)
        result = anchor_log(ref, "/repo", batch.id, batch.version, read_rows, lambda: KEY)
        assert result.incremental and result.previous_size == batch.version - 1
    assert reads == [2, 3, 4]
    signed = Checkpoint.open(ref.commits[-1]["checkpoint"].decode(), KEY.verifier)
    assert (signed.size, signed.root) == (5, merkle.root_of(log_leaves(store.stored_events(batch.id))))


def test_a_kept_state_the_ref_does_not_match_reads_the_log_whole(store):
    ref, batch = FakeRef(), batch_of(store)
    anchor(ref, store, batch)
    batch.note_drift(AT, "p")
    store.save(batch)
    anchor(ref, store, batch)
    ref.commits.pop()  # another writer's ref, one checkpoint behind what this machine kept
    batch.note_drift(AT, "q")
    store.save(batch)
    result = anchor(ref, store, batch)
    assert result.incremental is False and (result.previous_size, result.size) == (2, 4)
