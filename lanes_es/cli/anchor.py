"""The commands of the audit anchored outside the store: `key show`, `prove`, `verify-proof`,
and what `verify` reads from git (the checkpoint ref, the attestations, the batch branch).

`cryptography` (the `audit` extra) is imported only when a key is read or a signature checked.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence, TextIO

from lanes_es.errors import ServiceError
from lanes_es.exit_codes import EXIT_OK

PROOF_FORMAT = "lanes-es/inclusion-proof/v1"


def register(commands: Any) -> None:
    from lanes_es.cli.main import BATCH_HELP

    command = commands.add_parser(
        "key", help="the signing key of checkpoints and attestations",
        description="`lanes-es key show` prints the public key that verifies this repository's checkpoints and "
                    "attestations (generating the signing key on first use, mode 600, in the git common dir; "
                    "LANES_ES_SIGNING_KEY names another key file). Give it to whoever verifies.")
    command.add_argument("action", choices=["show"], help="show: print the public key (signed-note form)")
    command.set_defaults(func=_key_show)

    command = commands.add_parser(
        "prove", help="print an inclusion proof of one event in the batch's signed checkpoint",
        description="Print, as JSON, the proof that event N of the batch is in the tree the newest checkpoint "
                    "signed: the event's bytes, its leaf hash, the RFC 6962 audit path and the checkpoint. "
                    "`lanes-es verify-proof FILE --public-key KEY` checks it without the store.")
    command.add_argument("batch_id", metavar="BATCH", help=BATCH_HELP)
    command.add_argument("--event", type=int, required=True, metavar="N", help="the event's version (1 is the first)")
    command.add_argument("-o", "--output", default=None, metavar="FILE", help="write here instead of stdout")
    command.set_defaults(func=_prove)

    command = commands.add_parser(
        "verify-proof", help="check an inclusion proof against a checkpoint and a public key alone",
        description="Check a proof printed by `lanes-es prove`: the checkpoint's signature with the public key, "
                    "the event's leaf hash, and its audit path to the signed root. Needs no store and no "
                    "repository. Exit 0 when it holds, 1 when it does not.")
    command.add_argument("proof", metavar="PROOF_FILE", help="the proof `lanes-es prove` wrote")
    command.add_argument("--public-key", required=True, metavar="KEY", help="the public key, or a file holding it")
    command.add_argument("--checkpoint", default=None, metavar="FILE",
                         help="the checkpoint to check against (default: the one the proof carries)")
    command.set_defaults(func=_verify_proof)


# ---------------------------------------------------------------- what verify reads


@dataclass
class AnchorOptions:
    checkpoint_file: str | None = None
    public_key: str | None = None
    root: str | None = None

    @classmethod
    def of(cls, args: argparse.Namespace) -> "AnchorOptions":
        return cls(getattr(args, "checkpoint", None), getattr(args, "public_key", None), getattr(args, "root", None))

    def check(self, report: Any, rows: Sequence[Any], events: Sequence[Any], root: Path | None) -> None:
        """Add the findings of the checkpoint, the attestations and the batch branch to `report`."""
        from lanes_es.audit.verify import add_anchor_findings

        evidence = self.evidence(report.batch_id, events, root)
        add_anchor_findings(report, rows, events, evidence)

    def evidence(self, batch_id: str, events: Sequence[Any], root: Path | None) -> Any:
        from lanes_es.adapters.anchor_git import branch_history, checkpoint_history, read_anchor
        from lanes_es.audit.anchor import checkpoint_ref
        from lanes_es.audit.anchored import AnchorEvidence
        from lanes_es.domain import events as ev

        repository = _repository(root or self.root)
        note, attestations, source = None, None, "no repository to read refs/lanes-es/checkpoints from"
        history: list[tuple[str, str | None]] = []
        if repository is not None:
            note, attestations = read_anchor(str(repository.root), batch_id)
            attestations = attestations if note is not None else None
            source = f"{checkpoint_ref(batch_id)} in {repository.root}"
            history = checkpoint_history(str(repository.root), batch_id) if note is not None else []
        if self.checkpoint_file:
            note, source = _read_text(self.checkpoint_file, "checkpoint"), self.checkpoint_file
        verifier = self.verifier(repository.common_dir if repository else None) if note is not None else None
        if note is not None and verifier is None:
            raise ServiceError("invalid_input", f"the checkpoint of {batch_id} is signed: name its public key with "
                                                f"--public-key KEY (`lanes-es key show` prints it where the key lives)")
        evidence = AnchorEvidence(source=source, note=note, verifier=verifier, attestations=attestations,
                                  history=history, anchored=_anchored_size(repository, batch_id))
        prepared = next((event for event in events if isinstance(event, ev.BatchPrepared)), None)
        if repository is None or prepared is None:
            evidence.branch_problem = "no repository holding the batch branch"
        else:
            evidence.branch_history, evidence.branch_problem = branch_history(
                str(repository.root), prepared.branch, prepared.base_head, _recorded_head(events))
        return evidence

    def verifier(self, common_dir: Path | None) -> Any:
        from lanes_es.adapters.signing_key import local_verifier, read_verifier
        from lanes_es.audit.signing import AuditExtraMissing, KeyError_

        named = self.public_key or os.environ.get("LANES_ES_PUBLIC_KEY")
        try:
            return read_verifier(named) if named else local_verifier(common_dir)
        except AuditExtraMissing as error:
            raise ServiceError("audit_extra_missing", str(error)) from None
        except KeyError_ as error:
            raise ServiceError("invalid_public_key", str(error)) from None


def _recorded_head(events: Sequence[Any]) -> str | None:
    """The batch head the log ends at (its last integration or adopted head): where a deleted branch stood."""
    from lanes_es.domain import events as ev

    head = None
    for event in events:
        if isinstance(event, ev.Integrated):
            head = event.commit
        elif isinstance(event, ev.HeadAdopted):
            head = event.to_head
    return head


def _anchored_size(repository: Any, batch_id: str) -> int | None:
    """The size this repository's marker says was anchored on its checkpoint ref, None when never anchored here."""
    from lanes_es.adapters.anchored_marker import anchored_dir, anchored_tip

    tip = anchored_tip(anchored_dir(repository.common_dir), batch_id) if repository is not None else None
    return tip[0] if tip else None


def _repository(root: str | Path | None) -> Any:
    from lanes_es.bootstrap import locate_repository

    try:
        return locate_repository(root or ".")
    except ServiceError:
        return None


# The most read of each file a user names: a checkpoint is a signed note of a few lines; a proof carries one
# event (the largest, a BatchPrepared of thousands of children, is a few MB) in base64 and a log-sized path.
READ_LIMITS = {"checkpoint": 64 * 1024, "proof": 16 * 1024 * 1024}


def _read_text(path: str, what: str) -> str:
    from lanes_es.adapters.files import read_capped_text

    try:
        return read_capped_text(path, READ_LIMITS[what])
    except (OSError, UnicodeDecodeError) as error:
        raise ServiceError("invalid_input", f"cannot read the {what} {path}: {getattr(error, 'strerror', error)}") from None


# ---------------------------------------------------------------- key show


def _key_show(args: argparse.Namespace, out: TextIO | None = None) -> int:
    from lanes_es.adapters.signing_key import load_signer
    from lanes_es.audit.signing import KeyError_
    from lanes_es.bootstrap import locate_repository

    repository = locate_repository(args.root)
    try:
        signer = load_signer(repository.common_dir)
    except KeyError_ as error:
        raise ServiceError("signing_key_unavailable", str(error)) from None
    (out or sys.stdout).write(signer.verifier.text() + "\n")
    return EXIT_OK


# ---------------------------------------------------------------- prove


def _prove(args: argparse.Namespace) -> int:
    from lanes_es.cli.audit import _with_store

    return _with_store(args, lambda store, root: prove_command(store, root, args.batch_id, args.event,
                                                              Path(args.output) if args.output else None))


def prove_command(store: Any, root: Path, batch_id: str, version: int, output: Path | None = None,
                  out: TextIO | None = None) -> int:
    from lanes_es.adapters.anchor_git import read_anchor
    from lanes_es.audit import merkle
    from lanes_es.audit.anchor import leaf_data, log_leaves
    from lanes_es.audit.signed_note import Checkpoint, NoteError
    from lanes_es.cli.audit import load_sound_rows

    rows, _ = load_sound_rows(store, batch_id)  # a damaged log is refused, never proved (verify names the damage)
    note, _ = read_anchor(str(root), batch_id)
    if note is None:
        from lanes_es.audit.signing import audit_extra_missing

        missing = audit_extra_missing()
        raise ServiceError("no_checkpoint", f"{batch_id} has no checkpoint in {root} yet: "
                                            + (f"{missing}, then the next tick writes it" if missing
                                               else "the next `lanes-es tick` that records an event writes it"))
    try:
        checkpoint = Checkpoint.read_unverified(note)
    except NoteError as error:
        raise ServiceError("invalid_checkpoint", f"the checkpoint of {batch_id} does not parse: {error}") from None
    if not 1 <= version <= min(checkpoint.size, len(rows)):
        raise ServiceError("invalid_input", f"event {version} is not in the checkpoint of {batch_id}, which covers "
                                            f"events 1 to {checkpoint.size}")
    leaves = log_leaves(rows[:checkpoint.size])
    proof = {"format": PROOF_FORMAT, "origin": batch_id, "event_version": version, "leaf_index": version - 1,
             "tree_size": checkpoint.size, "event": base64.b64encode(leaf_data(rows[version - 1])).decode(),
             "leaf_hash": leaves[version - 1].hex(),
             "proof": [node.hex() for node in merkle.inclusion_proof(version - 1, leaves)], "checkpoint": note}
    text = json.dumps(proof, indent=2) + "\n"
    if output is not None:
        output.write_text(text, encoding="utf-8")
    else:
        (out or sys.stdout).write(text)
    return EXIT_OK


# ---------------------------------------------------------------- verify-proof


def _verify_proof(args: argparse.Namespace) -> int:
    return verify_proof_command(Path(args.proof), args.public_key, args.checkpoint)


def verify_proof_command(path: Path, public_key: str, checkpoint_file: str | None = None,
                         out: TextIO | None = None) -> int:
    """Needs no store and no repository: the proof, a checkpoint and a public key."""
    from lanes_es.audit import merkle
    from lanes_es.audit.signed_note import Checkpoint, NoteError
    from lanes_es.cli.audit import EXIT_FAILED

    out = out or sys.stdout
    proof = _read_proof(path)
    verifier = AnchorOptions(public_key=public_key).verifier(None)
    note = _read_text(checkpoint_file, "checkpoint") if checkpoint_file else proof["checkpoint"]
    failures = []
    try:
        checkpoint = Checkpoint.open(note, verifier)
    except NoteError as error:
        checkpoint = None
        failures.append(f"the checkpoint does not verify: {error}")
    event = base64.b64decode(proof["event"])
    if merkle.leaf_hash(event).hex() != proof["leaf_hash"]:
        failures.append("the event's bytes do not hash to the proof's leaf hash")
    if checkpoint is not None:
        if checkpoint.origin != proof["origin"]:
            failures.append(f"the checkpoint is of {checkpoint.origin}, the proof of {proof['origin']}")
        if checkpoint.size != proof["tree_size"]:
            failures.append(f"the proof is for a tree of {proof['tree_size']} events, the checkpoint signed "
                            f"{checkpoint.size}")
        elif not merkle.verify_inclusion(proof["leaf_index"], checkpoint.size, merkle.leaf_hash(event),
                                         [bytes.fromhex(node) for node in proof["proof"]], checkpoint.root):
            failures.append("the audit path does not lead to the checkpoint's signed root")
    for failure in failures:
        out.write(f"FAIL {failure}\n")
    if failures:
        out.write(f"NOT verified: event {proof['event_version']} of {proof['origin']}\n")
        return EXIT_FAILED
    out.write(f"verified: event {proof['event_version']} of {proof['origin']} is in the signed checkpoint of "
              f"{checkpoint.size} events\n")  # type: ignore[union-attr]
    return EXIT_OK


def _read_proof(path: Path) -> dict[str, Any]:
    from lanes_es.domain.jstext import parse_json

    text = _read_text(str(path), "proof")
    try:
        proof = parse_json(text)
        if proof.get("format") != PROOF_FORMAT:
            raise ValueError(f"not a {PROOF_FORMAT} document")
        for name, kind in (("origin", str), ("event_version", int), ("leaf_index", int), ("tree_size", int),
                           ("event", str), ("leaf_hash", str), ("proof", list), ("checkpoint", str)):
            if not isinstance(proof.get(name), kind):
                raise ValueError(f"{name} is missing or not a {kind.__name__}")
        base64.b64decode(proof["event"], validate=True)
        [bytes.fromhex(node) for node in proof["proof"]]
    except (ValueError, AttributeError) as error:
        raise ServiceError("invalid_proof", f"{path} is not an inclusion proof of lanes-es: {error}") from None
    return proof


# ---------------------------------------------------------------- the timeline's marks


def anchor_marks(root: Path | str | None, batch_id: str) -> Any:
    """The checkpoints and attestations on the batch's ref, for replay and the audit page (shown, not verified:
    `lanes-es verify` checks them)."""
    from lanes_es.adapters.anchor_git import checkpoint_history, read_anchor
    from lanes_es.audit.signed_note import Checkpoint, NoteError
    from lanes_es.projections.timeline import AnchorMarks

    if root is None:
        return AnchorMarks()
    checkpoints = []
    for _, note in checkpoint_history(str(root), batch_id):
        if note is None:
            continue
        try:
            checkpoint = Checkpoint.read_unverified(note)
        except NoteError:
            continue
        checkpoints.append((checkpoint.size, checkpoint.root.hex()))
    _, attestations = read_anchor(str(root), batch_id)
    attested = {}
    for path in attestations:
        number = path.removeprefix("attestations/").split("-", 1)[0]
        if number.isdigit():
            attested[int(number)] = path
    return AnchorMarks(checkpoints=checkpoints, attested=attested)
