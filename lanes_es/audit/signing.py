"""Ed25519 keys in the signed-note text forms (C2SP signed-note, golang.org/x/mod/sumdb/note).

A verifier key is `name+hash+base64(0x01 || public key)`, a signer key
`PRIVATE+KEY+name+hash+base64(0x01 || seed)`, where hash is the first four bytes of
sha256(name || "\\n" || 0x01 || public key), as eight hex digits. The same key signs the
checkpoints (signed notes) and the attestations (DSSE envelopes); verifying needs only the
verifier key. `cryptography` is imported on first use, so the rest of lanes-es runs without it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass
from functools import cached_property
from typing import Any

ED25519 = 0x01
_PRIVATE_PREFIX = "PRIVATE+KEY+"


class KeyError_(ValueError):
    """A key text that cannot be read; the message names what is wrong."""


def key_hash(name: str, public: bytes) -> int:
    return int.from_bytes(hashlib.sha256(name.encode() + b"\n" + bytes([ED25519]) + public).digest()[:4], "big")


def _check_name(name: str) -> None:
    if not name or "+" in name or any(ch.isspace() for ch in name):
        raise KeyError_(f"key name {name!r} must be non-empty, without '+' or spaces")


AUDIT_EXTRA_MISSING = ("the `cryptography` package is not installed (signing and checking checkpoints need it): "
                       "pip install 'lanes-es[audit]'")


class AuditExtraMissing(KeyError_):
    """The `audit` extra is not installed: the key is not at fault."""


def audit_extra_missing() -> str | None:
    """What to install when `cryptography` is missing, else None (looked up, not imported: it is slow to import)."""
    import importlib.util

    try:
        found = importlib.util.find_spec("cryptography") is not None
    except (ImportError, ValueError):  # a module set to None in sys.modules
        found = False
    return None if found else AUDIT_EXTRA_MISSING


def _crypto() -> Any:
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise AuditExtraMissing(AUDIT_EXTRA_MISSING) from None
    return ed25519


@dataclass(frozen=True)
class Verifier:
    name: str
    public: bytes

    @property
    def key_id(self) -> int:
        return key_hash(self.name, self.public)

    def text(self) -> str:
        return f"{self.name}+{self.key_id:08x}+{base64.b64encode(bytes([ED25519]) + self.public).decode()}"

    def verify(self, message: bytes, signature: bytes) -> bool:
        ed25519 = _crypto()
        from cryptography.exceptions import InvalidSignature

        try:
            ed25519.Ed25519PublicKey.from_public_bytes(self.public).verify(signature, message)
        except InvalidSignature:
            return False
        return True

    @classmethod
    def parse(cls, text: str) -> "Verifier":
        """A verifier key `name+hash+keydata`; `KeyError_` on any mangling."""
        name, hash_text, public = _key_parts(text.strip(), "public key", "name+hash+keydata (`lanes-es key show` "
                                                                         "prints it)")
        verifier = cls(name, public)
        _check_hash(verifier, hash_text, "public key")
        return verifier


@dataclass(frozen=True)
class Signer:
    name: str
    seed: bytes

    @cached_property
    def _key(self) -> Any:
        return _crypto().Ed25519PrivateKey.from_private_bytes(self.seed)

    @cached_property
    def verifier(self) -> Verifier:
        # public_bytes_raw, not public_bytes(Encoding.Raw, ...): the serialization package imports every
        # key type's loaders (20-30 ms), paid by every tick that signs its checkpoint.
        return Verifier(self.name, self._key.public_key().public_bytes_raw())

    def sign(self, message: bytes) -> bytes:
        return self._key.sign(message)

    def text(self) -> str:
        key_id = key_hash(self.name, self.verifier.public)
        return f"{_PRIVATE_PREFIX}{self.name}+{key_id:08x}+{base64.b64encode(bytes([ED25519]) + self.seed).decode()}"

    @classmethod
    def parse(cls, text: str) -> "Signer":
        if not text.startswith(_PRIVATE_PREFIX):
            raise KeyError_("a signing key starts with PRIVATE+KEY+")
        name, hash_text, seed = _key_parts(text.strip()[len(_PRIVATE_PREFIX):], "signing key",
                                           "PRIVATE+KEY+name+hash+keydata")
        signer = cls(name, seed)
        _check_hash(signer.verifier, hash_text, "signing key")
        return signer

    @classmethod
    def generate(cls, name: str) -> "Signer":
        import os

        _check_name(name)
        return cls(name, os.urandom(32))


def _key_parts(text: str, what: str, form: str) -> tuple[str, str, bytes]:
    """name, hash text and key bytes of `name+hash+base64(0x01 || key)`."""
    parts = text.split("+", 2)
    if len(parts) != 3:
        raise KeyError_(f"a {what} reads {form}")
    name, hash_text, data = parts
    _check_name(name)
    return name, hash_text, _decode_key(data, what)


def _check_hash(verifier: Verifier, hash_text: str, what: str) -> None:
    if len(hash_text) != 8 or any(ch not in "0123456789abcdef" for ch in hash_text) \
            or int(hash_text, 16) != verifier.key_id:
        raise KeyError_(f"{what} {verifier.name}: its hash {hash_text} does not match its key")


def _decode_key(data: str, what: str) -> bytes:
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise KeyError_(f"the {what} is not base64") from None
    if len(raw) != 33 or raw[0] != ED25519:
        raise KeyError_(f"the {what} is not an Ed25519 key (type 0x01, 32 bytes)")
    return raw[1:]
