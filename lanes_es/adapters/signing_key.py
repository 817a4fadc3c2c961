"""Where the batch signing key lives: `LANES_ES_SIGNING_KEY` (a key file), else
`<git common dir>/lanes-es/signing.key`, generated on first use with mode 600.

The file holds one signer key in the signed-note text form (`PRIVATE+KEY+lanes-es+...`), so
Go's sumdb/note tools read it too. Only the public key leaves the machine: `lanes-es key show`.
"""

from __future__ import annotations

import os
from pathlib import Path

from lanes_es.audit.signing import KeyError_, Signer, Verifier

KEY_ENV = "LANES_ES_SIGNING_KEY"
PUBLIC_KEY_ENV = "LANES_ES_PUBLIC_KEY"
KEY_NAME = "lanes-es"


def key_path(common_dir: Path) -> Path:
    named = os.environ.get("LANES_ES_SIGNING_KEY")
    return Path(named) if named else common_dir / "lanes-es" / "signing.key"


def load_signer(common_dir: Path, create: bool = True) -> Signer:
    """The signing key; generated (mode 600) on first use unless LANES_ES_SIGNING_KEY names a file."""
    path = key_path(common_dir)
    if not path.exists() and create and not os.environ.get("LANES_ES_SIGNING_KEY"):
        _generate(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise KeyError_(f"cannot read the signing key {path}: {error.strerror or error}") from None
    try:
        return Signer.parse(text.strip())
    except KeyError_ as error:
        raise KeyError_(f"{path}: {error}") from None


def _generate(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    signer = Signer.generate(KEY_NAME)
    try:  # O_EXCL: two first ticks at once keep one key, the loser reads the winner's
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(signer.text() + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def read_verifier(text_or_path: str) -> Verifier:
    """A public key given as its text (name+hash+keydata) or as a file holding it."""
    candidate = Path(text_or_path)
    text = text_or_path
    if "+" not in text_or_path or candidate.is_file():
        try:
            text = candidate.read_text(encoding="utf-8").strip()
        except OSError as error:
            raise KeyError_(f"cannot read the public key {text_or_path}: {error.strerror or error}") from None
    return Verifier.parse(text)


def local_verifier(common_dir: Path | None) -> Verifier | None:
    """The public key of this repository's signing key, when there is one (never generates it)."""
    if common_dir is None:
        return None
    path = key_path(common_dir)
    if not path.exists():
        return None
    return load_signer(common_dir, create=False).verifier
