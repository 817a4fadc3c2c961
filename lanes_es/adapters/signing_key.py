"""Where the batch signing key lives: `LANES_ES_SIGNING_KEY` (a key file), else
`<git common dir>/lanes-es/signing.key`, generated on first use with mode 600.

The file holds one signer key in the signed-note text form (`PRIVATE+KEY+lanes-es+...`), so
Go's sumdb/note tools read it too. Only the public key leaves the machine: `lanes-es key show`.
"""

from __future__ import annotations

import os
from pathlib import Path

from lanes_es.adapters.files import FileTooLarge, read_capped_text, size_text
from lanes_es.audit.signing import AuditExtraMissing, KeyError_, Signer, Verifier
from lanes_es.errors import naming

KEY_ENV = "LANES_ES_SIGNING_KEY"
MAX_KEY_FILE_BYTES = 64 * 1024  # a key is one line of about 100 characters
PUBLIC_KEY_ENV = "LANES_ES_PUBLIC_KEY"
KEY_NAME = "lanes-es"


def key_path(common_dir: Path) -> Path:
    named = os.environ.get("LANES_ES_SIGNING_KEY")
    return Path(named) if named else common_dir / "lanes-es" / "signing.key"


def load_signer(common_dir: Path, create: bool = True) -> Signer:
    """The signing key; generated (mode 600) on first use unless LANES_ES_SIGNING_KEY names a file."""
    path = key_path(common_dir)
    if not path.exists() and create and not os.environ.get("LANES_ES_SIGNING_KEY"):
        try:
            _generate(path)
        except OSError as error:  # a full disk: no key, so no checkpoint this time; the next tick makes it
            raise KeyError_(f"cannot make the signing key {path}: {error.strerror or error}; free some space (or "
                            f"fix the directory's mode) and the next tick makes it") from None
    fix = (f"; name a signed-note key file (PRIVATE+KEY+...) with {KEY_ENV}, or unset it for the repository's own"
           if os.environ.get("LANES_ES_SIGNING_KEY") else "; move it away and a new key is made on the next tick (auditors then "
                                            "need the new `lanes-es key show`)")
    try:
        text = read_capped_text(path, MAX_KEY_FILE_BYTES)
    except OSError as error:
        raise KeyError_(f"cannot read the signing key {path}: {error.strerror or error}{fix}") from None
    except (UnicodeDecodeError, FileTooLarge):
        raise KeyError_(f"{path} is not a signing key (it is not text of a few lines){fix}") from None
    try:
        return Signer.parse(text.strip())
    except AuditExtraMissing:
        raise  # the key is not at fault
    except KeyError_ as error:
        raise KeyError_(f"{path}: {error}{fix}") from None


def _generate(path: Path) -> None:
    """The key is written whole to a temporary file, then linked into place: a full disk leaves no half-written
    key behind (which every later tick would refuse), and of two first ticks at once the loser reads the winner's."""
    path.parent.mkdir(parents=True, exist_ok=True)
    signer = Signer.generate(KEY_NAME)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with naming(path):
            descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
                handle.write(signer.text() + "\n")
                handle.flush()
                os.fsync(handle.fileno())
            try:
                os.link(temporary, path)
            except FileExistsError:
                pass
    finally:
        temporary.unlink(missing_ok=True)


def read_verifier(text_or_path: str) -> Verifier:
    """A public key given as its text (name+hash+keydata) or as a file holding it."""
    candidate = Path(text_or_path)
    text = text_or_path
    if "+" not in text_or_path or candidate.is_file():
        try:
            text = read_capped_text(candidate, MAX_KEY_FILE_BYTES).strip()
        except FileTooLarge:
            raise KeyError_(f"the public key file {text_or_path} holds more than a key (over "
                            f"{size_text(MAX_KEY_FILE_BYTES)}); give the key's text (name+hash+keydata, as "
                            f"`lanes-es key show` prints it) or a file holding it") from None
        except OSError as error:
            raise KeyError_(f"cannot read the public key {text_or_path}: {error.strerror or error}; give the key's "
                            f"text (name+hash+keydata, as `lanes-es key show` prints it) or a file holding it") from None
        except UnicodeDecodeError:
            raise KeyError_(f"the public key file {text_or_path} is not text; give the key's text (name+hash+keydata, "
                            f"as `lanes-es key show` prints it) or a file holding it") from None
    return Verifier.parse(text)


def local_verifier(common_dir: Path | None) -> Verifier | None:
    """The public key of this repository's signing key, when there is one (never generates it)."""
    if common_dir is None:
        return None
    path = key_path(common_dir)
    if not path.exists():
        return None
    return load_signer(common_dir, create=False).verifier
