"""Anchor a batch's log outside the store: a signed checkpoint and an attestation per integration.

After a tick saved events, `anchor_log` brings the batch's checkpoint ref in git up to the
log: it checks that the log still holds what the previous checkpoint signed (the same root
over the same first events), signs a checkpoint of the whole log, attests every
integration recorded since, and writes them in one commit on the ref. It signs nothing
over a log whose chain is broken or that no longer extends the previous checkpoint, so a
store cut short or rewritten cannot be made to look whole again.

A crash between the events and the checkpoint leaves the ref behind the log; the next
tick finds it behind (the size it last anchored is kept beside the store's locks) and
completes it. `verify` meanwhile says "checkpoint behind by n events".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

from eventsourcing.persistence import StoredEvent

from lanes_es.domain import events as ev

from . import merkle
from .attestation import (
    CHECKPOINT_PATH, SUMMARY_PATH, IntegrationFact, integration_facts, integration_statement, statement_bytes,
    summary_statement,
)
from .chain import sealed_bytes, verify_stored
from .dsse import envelope_bytes, sign_envelope
from .signed_note import Checkpoint, NoteError
from .signing import Signer

REF_PREFIX = "refs/lanes-es/checkpoints/"


def checkpoint_ref(batch_id: str) -> str:
    return REF_PREFIX + batch_id


class AnchorRefused(Exception):
    """The checkpoint was not written; the message says why and what to run."""


class AnchorGit(Protocol):
    def read_checkpoint(self, root: str, batch_id: str, requests: Sequence[tuple[str, str | None]] = ()
                        ) -> tuple[str | None, str | None, dict[str, tuple[str, bytes | None]]]:
        """The ref's commit and its checkpoint note ((None, None) without the ref), and `describe(requests)`,
        in one read."""

    def describe(self, root: str, requests: Sequence[tuple[str, str | None]]) -> dict[str, tuple[str, bytes | None]]:
        """For each (commit, path): the commit's tree and the blob at path on it (None when absent)."""

    def write(self, root: str, batch_id: str, parent: str | None, files: dict[str, bytes], message: str) -> None:
        """One commit on the ref adding `files` to the parent's tree; refused when the ref moved."""

    def anchored_size(self, batch_id: str) -> int | None:
        """The log size last anchored, as this machine remembers it."""

    def mark_anchored(self, batch_id: str, size: int) -> None:
        """Remember that the ref covers `size` events."""


@dataclass(frozen=True)
class AnchorResult:
    size: int
    previous_size: int
    attestations: int
    summary: bool


def leaf_data(row: StoredEvent) -> bytes:
    """The bytes a leaf commits to: the event's sealed bytes, as the chain hashes them."""
    try:
        return sealed_bytes(row)
    except ValueError:
        state = row.state  # a row that is not JSON still has a leaf; its root then differs
        return state.encode("utf-8", "surrogateescape") if isinstance(state, str) else bytes(state)


def log_leaves(rows: Sequence[StoredEvent]) -> list[bytes]:
    return [merkle.leaf_hash(leaf_data(row)) for row in rows]


def anchor_log(git: AnchorGit, root: str, batch_id: str, version: int,
               read_rows: Callable[[], Sequence[StoredEvent]], signer: Callable[[], Signer]) -> AnchorResult | None:
    """Bring the checkpoint ref of `batch_id` up to the log's `version`; None when it already is.

    Two git spawns in the usual case: one read (the ref, its checkpoint, and the tree and
    intent of each integration newer than the size last anchored) and one write.
    """
    remembered = git.anchored_size(batch_id)
    if version <= 0 or remembered == version:
        return None
    rows = list(read_rows())
    events, breaks = verify_stored(rows)
    if breaks:
        raise AnchorRefused(f"the log of {batch_id} is broken at {breaks[0].describe()}; no checkpoint is signed "
                            f"over it. `lanes-es verify {batch_id}` shows every finding")
    facts = integration_facts(events)
    guessed = [fact for fact in facts if fact.version > (remembered or 0)]
    parent, note, described = git.read_checkpoint(root, batch_id, _requests(guessed))
    key = signer()
    previous = _previous_checkpoint(note, key, batch_id)
    leaves = log_leaves(rows)
    if previous is not None:
        _check_prefix(leaves, previous, batch_id)
        if previous.size == len(rows):  # written before a crash kept this machine from remembering it
            git.mark_anchored(batch_id, len(rows))
            return None
    checkpoint = Checkpoint(batch_id, len(leaves), merkle.root_of(leaves))
    files = {CHECKPOINT_PATH: checkpoint.sign(key).encode()}
    previous_size = previous.size if previous else 0
    new = [fact for fact in facts if fact.version > previous_size]
    undescribed = [fact for fact in new if fact.commit not in described]
    if undescribed:  # the size remembered here was ahead of the ref: read what the guess missed
        described.update(git.describe(root, _requests(undescribed)))
    files.update(_attestations(new, described, key))
    settled = _settled_state(events[previous_size:])
    if settled is not None:
        summary = summary_statement(batch_id, settled, checkpoint.size, checkpoint.root.hex(), facts)
        files[SUMMARY_PATH] = envelope_bytes(sign_envelope(statement_bytes(summary), key))
    git.write(root, batch_id, parent, files, f"lanes-es checkpoint {batch_id} size {checkpoint.size}\n")
    git.mark_anchored(batch_id, checkpoint.size)
    return AnchorResult(size=checkpoint.size, previous_size=previous_size, attestations=len(new),
                        summary=settled is not None)


def _requests(facts: Sequence[IntegrationFact]) -> list[tuple[str, str | None]]:
    return [(fact.commit, (fact.intent or {}).get("path")) for fact in facts]


def _previous_checkpoint(note: str | None, key: Signer, batch_id: str) -> Checkpoint | None:
    if note is None:
        return None
    try:
        checkpoint = Checkpoint.open(note, key.verifier)
    except NoteError as error:
        raise AnchorRefused(f"the checkpoint on {checkpoint_ref(batch_id)} does not verify with the signing key "
                            f"({error}); restore the key that signed it (LANES_ES_SIGNING_KEY names a key file)") from None
    if checkpoint.origin != batch_id:
        raise AnchorRefused(f"the checkpoint on {checkpoint_ref(batch_id)} is of {checkpoint.origin}, not {batch_id}")
    return checkpoint


def _check_prefix(leaves: list[bytes], previous: Checkpoint, batch_id: str) -> None:
    if len(leaves) < previous.size:
        raise AnchorRefused(f"the log of {batch_id} holds {len(leaves)} events but its checkpoint signed "
                            f"{previous.size}: events were removed; no checkpoint is signed over it. "
                            f"`lanes-es verify {batch_id}` names the difference")
    if merkle.root_of(leaves[:previous.size]) != previous.root:
        raise AnchorRefused(f"the first {previous.size} events of {batch_id} are not the ones its checkpoint "
                            f"signed: the log was rewritten; no checkpoint is signed over it. "
                            f"`lanes-es verify {batch_id}` names the difference")


def _attestations(facts: list[IntegrationFact], described: dict[str, tuple[str, bytes | None]],
                  key: Signer) -> dict[str, bytes]:
    files = {}
    for fact in facts:
        tree, intent = described.get(fact.commit, ("", None))
        statement = integration_statement(fact, tree, intent)
        files[fact.path] = envelope_bytes(sign_envelope(statement_bytes(statement), key))
    return files


def _settled_state(events: Sequence[Any]) -> str | None:
    """The state of the newest settle among `events`, when it is one that ends or stops the batch."""
    state = None
    for event in events:
        if isinstance(event, ev.BatchSettled):
            state = event.batch_state
        elif isinstance(event, ev.BatchSuperseded):
            state = "superseded"
    return state
