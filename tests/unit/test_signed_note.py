"""Signed notes, checkpoints and DSSE against published vectors: the golang.org/x/mod/sumdb/note
example key and signature (a different implementation of the same format), and the DSSE spec's PAE."""

from __future__ import annotations

import pytest

from lanes_es.audit import merkle
from lanes_es.audit.dsse import EnvelopeError, envelope_bytes, open_envelope, pae, sign_envelope
from lanes_es.audit.signed_note import Checkpoint, NoteError, open_note, sign_note
from lanes_es.audit.signing import KeyError_, Signer, Verifier

GO_SIGNER = "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz"
GO_VERIFIER = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
GO_TEXT = "If you think cryptography is the answer to your problem,\nthen you don't know what your problem is.\n"
GO_NOTE = (GO_TEXT + "\n\u2014 PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpR"
           "Zb6KE6RyyBwJnAM=\n")


def test_keys_read_and_write_the_go_key_texts():
    signer = Signer.parse(GO_SIGNER)
    assert signer.text() == GO_SIGNER
    assert signer.verifier.text() == GO_VERIFIER
    assert Verifier.parse(GO_VERIFIER) == signer.verifier


def test_signing_the_go_example_gives_its_signature_byte_for_byte():
    assert sign_note(GO_TEXT, Signer.parse(GO_SIGNER)) == GO_NOTE
    assert open_note(GO_NOTE, Verifier.parse(GO_VERIFIER)) == GO_TEXT


@pytest.mark.parametrize("mangled", [GO_VERIFIER[:-2], GO_VERIFIER.replace("c74f20a3", "c74f20a4"),
                                     GO_VERIFIER.replace("PeterNeumann", "Peter"), "PeterNeumann+c74f20a3"])
def test_a_mangled_public_key_is_refused(mangled):
    with pytest.raises(KeyError_):
        Verifier.parse(mangled)


def test_a_changed_note_or_another_key_does_not_verify():
    verifier = Verifier.parse(GO_VERIFIER)
    with pytest.raises(NoteError, match="does not hold"):
        open_note(GO_NOTE.replace("answer", "Answer"), verifier)
    other = Signer.generate("PeterNeumann").verifier
    with pytest.raises(NoteError, match="no signature of the key"):
        open_note(GO_NOTE, other)


def test_a_checkpoint_round_trips_and_names_its_fields():
    signer = Signer.generate("lanes-es")
    checkpoint = Checkpoint("batch-x-1", 8, merkle.root_of([merkle.leaf_hash(b"a")]))
    note = checkpoint.sign(signer)
    assert note.startswith("batch-x-1\n8\n")
    assert Checkpoint.open(note, signer.verifier) == checkpoint
    assert Checkpoint.read_unverified(note) == checkpoint
    with pytest.raises(NoteError):
        Checkpoint.open(note.replace("\n8\n", "\n9\n"), signer.verifier)


def test_pae_is_the_spec_example_and_envelopes_verify():
    assert pae("http://example.com/HelloWorld", b"hello world") == \
        b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
    signer = Signer.generate("lanes-es")
    data = envelope_bytes(sign_envelope(b'{"a": 1}', signer))
    assert open_envelope(data, signer.verifier) == {"a": 1}
    with pytest.raises(EnvelopeError):
        open_envelope(data, Signer.generate("lanes-es").verifier)
    with pytest.raises(EnvelopeError):
        open_envelope(data.replace(b'"payloadType": "application', b'"payloadType": "text'), signer.verifier)
