"""Anchor a batch's log outside the store: a signed checkpoint and an attestation per integration.

After a tick saved events, `anchor_log` brings the batch's checkpoint ref in git up to the
log: it checks that the log still holds what the previous checkpoint signed (the same root
over the same first events), signs a checkpoint of the whole log, attests every
integration recorded since, and writes them in one commit on the ref. It signs nothing
over a log whose chain is broken or that no longer extends the previous checkpoint, so a
store cut short or rewritten cannot be made to look whole again.

Incremental: beside the size it last anchored, this machine keeps the tree's right edge
(RFC 6962 compact range), the chain digest at that size and the folded facts of the
integrations (`AnchorState`). A tick then reads, checks and hashes only the events it
appended: their chain links continue from the kept digest (so a rewritten or re-grown store
breaks the first link and is looked at whole), and the ref's checkpoint must be the one kept
(size and root). Whenever either does not hold (no state, an older marker, a ref moved by
another machine, a crash between the write and the state) the whole log is read and checked,
as before.

A crash between the events and the checkpoint leaves the ref behind the log; the next
tick finds it behind and completes it. `verify` meanwhile says "checkpoint behind by n events".
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

import msgspec
from eventsourcing.persistence import StoredEvent

from lanes_es.domain import events as ev

from . import merkle
from .attestation import (
    CHECKPOINT_PATH, SUMMARY_PATH, FactsFold, IntegrationFact, integration_statement, statement_bytes,
    summary_statement,
)
from .chain import decode_rows, sealed_bytes, stored_digest, verify_stored
from .dsse import envelope_bytes, sign_envelope
from .signed_note import Checkpoint, NoteError
from .signing import Signer

REF_PREFIX = "refs/lanes-es/checkpoints/"


def checkpoint_ref(batch_id: str) -> str:
    return REF_PREFIX + batch_id


class AnchorRefused(Exception):
    """The checkpoint was not written; the message says why and what to run."""


class AnchorState(msgspec.Struct, kw_only=True):
    """What this machine keeps of the log it last anchored: enough to anchor only what a tick appends."""

    size: int
    root: str = ""  # hex; "" in a marker from before the state was kept (only the size then)
    digest: str = ""  # the chain digest of event `size`
    edge: list[str] = []  # the compact range (merkle.CompactRange), hex
    facts: FactsFold = msgspec.field(default_factory=FactsFold)

    @property
    def incremental(self) -> bool:
        return bool(self.root and self.digest) and len(self.edge) == bin(self.size).count("1")


class AnchorGit(Protocol):
    def read_checkpoint(self, root: str, batch_id: str, requests: Sequence[tuple[str, str | None]] = ()
                        ) -> tuple[str | None, str | None, dict[str, tuple[str, bytes | None]]]:
        """The ref's commit and its checkpoint note ((None, None) without the ref), and `describe(requests)`,
        in one read."""

    def describe(self, root: str, requests: Sequence[tuple[str, str | None]]) -> dict[str, tuple[str, bytes | None]]:
        """For each (commit, path): the commit's tree and the blob at path on it (None when absent)."""

    def write(self, root: str, batch_id: str, parent: str | None, files: dict[str, bytes], message: str) -> None:
        """One commit on the ref adding `files` to the parent's tree; refused when the ref moved."""

    def anchor_state(self, batch_id: str) -> AnchorState | None:
        """The log last anchored, as this machine remembers it."""

    def save_anchor_state(self, batch_id: str, state: AnchorState) -> None:
        """Remember that the ref covers `state.size` events."""


@dataclass(frozen=True)
class AnchorResult:
    size: int
    previous_size: int
    attestations: int
    summary: bool
    incremental: bool = False


def leaf_data(row: StoredEvent) -> bytes:
    """The bytes a leaf commits to: the event's sealed bytes, as the chain hashes them."""
    try:
        return sealed_bytes(row)
    except ValueError:
        state = row.state  # a row that is not JSON still has a leaf; its root then differs
        return state.encode("utf-8", "surrogateescape") if isinstance(state, str) else bytes(state)


def log_leaves(rows: Sequence[StoredEvent]) -> list[bytes]:
    return [merkle.leaf_hash(leaf_data(row)) for row in rows]


@dataclass
class _Log:
    """The log as this call knows it: the tree's edge, the facts, and what is new since `base`."""

    base: AnchorState | None  # the state it continues (incremental), None when read whole
    edge: merkle.CompactRange
    fold: FactsFold
    digest: str
    facts: list[IntegrationFact]  # the integrations folded by this call
    events: list[Any]  # the events folded by this call
    leaves: list[bytes] = field(default_factory=list)  # every leaf, when read whole

    @property
    def size(self) -> int:
        return self.edge.size


def anchor_log(git: AnchorGit, root: str, batch_id: str, version: int,
               read_rows: Callable[[int], Sequence[StoredEvent]], signer: Callable[[], Signer]) -> AnchorResult | None:
    """Bring the checkpoint ref of `batch_id` up to the log's `version`; None when it already is.

    `read_rows(after)` gives the stored rows after version `after` (0: the whole log). Two git spawns
    in the usual case: one read (the ref, its checkpoint, and the tree and intent of each new
    integration) and one write; none when nothing was appended.
    """
    state = git.anchor_state(batch_id)
    if version <= 0 or (state is not None and state.size == version):
        return None
    log = _appended(state, read_rows) if state is not None and state.incremental and state.size < version else None
    log = log or _whole(batch_id, read_rows)
    known = state.size if state is not None else 0  # integrations up to it were attested (if the ref agrees)
    parent, note, described = git.read_checkpoint(root, batch_id,
                                                  _requests([fact for fact in log.facts if fact.version > known]))
    key = signer()
    previous = _previous_checkpoint(note, key, batch_id)
    if previous is None and state is not None and state.size > 0:
        raise AnchorRefused(f"{checkpoint_ref(batch_id)} is gone although this machine anchored {state.size} events of "
                            f"{batch_id} on it: the ref was deleted, and a new one is not signed over it (that would "
                            f"hide the deletion). Restore the ref (from a clone or a remote that fetched "
                            f"refs/lanes-es/*); `lanes-es verify {batch_id}` shows the finding")
    if log.base is not None and (previous is None or (previous.size, previous.root.hex()) != (log.base.size,
                                                                                               log.base.root)):
        log = _whole(batch_id, read_rows)  # the ref is not where this machine left it: check the log whole
    if previous is not None and log.base is None:
        _check_prefix(log.leaves, previous, batch_id)
        if previous.size == log.size:  # written before a crash kept this machine from remembering it
            git.save_anchor_state(batch_id, _state(log))
            return None
    previous_size = previous.size if previous else 0
    new = [fact for fact in log.facts if fact.version > previous_size]
    undescribed = [fact for fact in new if fact.commit not in described]
    if undescribed:  # the log was read whole after the ref was: read what that read missed
        described.update(git.describe(root, _requests(undescribed)))
    files, settled = _anchor_files(batch_id, log, previous_size, new, described, key)
    git.write(root, batch_id, parent, files, f"lanes-es checkpoint {batch_id} size {log.size}\n")
    git.save_anchor_state(batch_id, _state(log))
    return AnchorResult(size=log.size, previous_size=previous_size, attestations=len(new), summary=settled,
                        incremental=log.base is not None)


def _anchor_files(batch_id: str, log: _Log, previous_size: int, new: list[IntegrationFact],
                  described: dict[str, tuple[str, bytes | None]], key: Signer) -> tuple[dict[str, bytes], bool]:
    """The checkpoint, the new attestations and, when the batch settled since `previous_size`, the summary."""
    checkpoint = Checkpoint(batch_id, log.size, log.edge.root())
    files = {CHECKPOINT_PATH: checkpoint.sign(key).encode(), **_attestations(new, described, key)}
    settled = _settled_state(event for event in log.events if event.originator_version > previous_size)
    if settled is not None:
        summary = summary_statement(batch_id, settled, checkpoint.size, checkpoint.root.hex(), log.fold.integrated)
        files[SUMMARY_PATH] = envelope_bytes(sign_envelope(statement_bytes(summary), key))
    return files, settled is not None


def _whole(batch_id: str, read_rows: Callable[[int], Sequence[StoredEvent]]) -> _Log:
    """The whole log, its chain checked; AnchorRefused when it is broken."""
    rows = list(read_rows(0))
    events, breaks = verify_stored(rows)
    if breaks:
        raise AnchorRefused(f"the log of {batch_id} is broken at {breaks[0].describe()}; no checkpoint is signed "
                            f"over it. `lanes-es verify {batch_id}` shows every finding")
    fold = FactsFold()
    facts = [fact for fact in (fold.apply(event) for event in events) if fact is not None]
    leaves = log_leaves(rows)
    return _Log(base=None, edge=merkle.CompactRange.of(leaves), fold=fold, digest=stored_digest(rows[-1]) if rows else "",
                facts=facts, events=events, leaves=leaves)


def _appended(state: AnchorState, read_rows: Callable[[int], Sequence[StoredEvent]]) -> _Log | None:
    """The events after `state.size`, when they continue the kept chain exactly; None otherwise."""
    rows = list(read_rows(state.size))
    kept, decoded, _ = decode_rows(rows)
    digest, expected_version = state.digest, state.size + 1
    for row, event in zip(kept, decoded):
        if event is None or row.originator_version != expected_version or event.originator_version != expected_version:
            return None
        try:
            link = hashlib.sha256(digest.encode() + sealed_bytes(row)).hexdigest()
        except ValueError:
            return None
        if link != stored_digest(row):
            return None  # the rows before it changed, or this one did: the whole log says which
        digest, expected_version = link, expected_version + 1
    if not kept:
        return None
    edge = merkle.CompactRange(state.size, [bytes.fromhex(item) for item in state.edge])
    for row in kept:
        edge.append(merkle.leaf_hash(leaf_data(row)))
    fold = msgspec.convert(msgspec.to_builtins(state.facts), FactsFold)  # a copy: the state is kept as it was
    events = [event for event in decoded if event is not None]
    facts = [fact for fact in (fold.apply(event) for event in events) if fact is not None]
    return _Log(base=state, edge=edge, fold=fold, digest=digest, facts=facts, events=events)


def _state(log: _Log) -> AnchorState:
    return AnchorState(size=log.size, root=log.edge.root().hex(), digest=log.digest,
                       edge=[item.hex() for item in log.edge.hashes], facts=log.fold)


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


def _settled_state(events: Any) -> str | None:
    """The state of the newest settle among `events`, when it is one that ends or stops the batch."""
    state = None
    for event in events:
        if isinstance(event, ev.BatchSettled):
            state = event.batch_state
        elif isinstance(event, ev.BatchSuperseded):
            state = "superseded"
    return state
