"""Signed notes and transparency-log checkpoints in their C2SP text forms (pure but for the signature).

A note is its text (ending in a newline), a blank line, and one line per signature:
`— <key name> base64(4-byte key hash || signature)`. A checkpoint (C2SP tlog-checkpoint) is
a note whose text is the origin, the tree size in decimal and the root hash in base64,
one per line. lanes-es signs one checkpoint per batch: origin = the batch id.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from .signing import Signer, Verifier

_DASH = "\u2014"  # the em dash that starts a signature line


class NoteError(ValueError):
    """A note or checkpoint that does not verify or does not parse; the message names why."""


def sign_note(text: str, signer: Signer) -> str:
    if not text.endswith("\n") or "\n\n" in text:
        raise NoteError("a note's text ends with a newline and holds no blank line")
    verifier = signer.verifier
    blob = verifier.key_id.to_bytes(4, "big") + signer.sign(text.encode())
    return f"{text}\n{_DASH} {signer.name} {base64.b64encode(blob).decode()}\n"


def open_note(note: str, verifier: Verifier) -> str:
    """The text of `note` when one of its signatures is `verifier`'s and holds; NoteError otherwise."""
    text, separator, signatures = note.rpartition("\n\n")
    if not separator or not signatures.endswith("\n"):
        raise NoteError("not a signed note: no blank line before the signature lines")
    text += "\n"
    found_key = False
    for line in signatures[:-1].split("\n"):
        prefix, _, rest = line.partition(" ")
        name, _, encoded = rest.partition(" ")
        if prefix != _DASH or not name or not encoded:
            raise NoteError(f"malformed signature line {line!r}")
        try:
            blob = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise NoteError(f"signature of {name} is not base64") from None
        if name != verifier.name or len(blob) < 5 or int.from_bytes(blob[:4], "big") != verifier.key_id:
            continue
        found_key = True
        if verifier.verify(text.encode(), blob[4:]):
            return text
    if found_key:
        raise NoteError(f"the signature of {verifier.name} does not hold: the note was changed after it was signed")
    raise NoteError(f"the note carries no signature of the key {verifier.name}+{verifier.key_id:08x}")


@dataclass(frozen=True)
class Checkpoint:
    origin: str
    size: int
    root: bytes

    def text(self) -> str:
        return f"{self.origin}\n{self.size}\n{base64.b64encode(self.root).decode()}\n"

    def sign(self, signer: Signer) -> str:
        return sign_note(self.text(), signer)

    @classmethod
    def parse_text(cls, text: str) -> "Checkpoint":
        lines = text.split("\n")
        if len(lines) < 4 or lines[-1] != "":
            raise NoteError("a checkpoint's text is origin, size and root hash, one per line")
        origin, size, root = lines[0], lines[1], lines[2]
        if not origin or not size.isdigit() or (size != "0" and size.startswith("0")):
            raise NoteError(f"checkpoint origin {origin!r} or size {size!r} is malformed")
        try:
            root_bytes = base64.b64decode(root, validate=True)
        except (binascii.Error, ValueError):
            raise NoteError("the checkpoint's root hash is not base64") from None
        if len(root_bytes) != 32:
            raise NoteError("the checkpoint's root hash is not 32 bytes")
        return cls(origin, int(size), root_bytes)

    @classmethod
    def open(cls, note: str, verifier: Verifier) -> "Checkpoint":
        return cls.parse_text(open_note(note, verifier))

    @classmethod
    def read_unverified(cls, note: str) -> "Checkpoint":
        """The body of a checkpoint without checking its signature (to show it, never to trust it)."""
        return cls.parse_text(note.rpartition("\n\n")[0] + "\n")
