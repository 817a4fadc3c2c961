"""DSSE envelopes (Dead Simple Signing Envelope v1), signed with the batch key.

The signature covers PAE(type, body) = "DSSEv1 <len(type)> <type> <len(body)> <body>".
Written here rather than taken from `securesystemslib`: its `dsse.Envelope` computes the
same PAE (checked against the spec's example), but signing goes through its own key and
signer abstractions, a second key format beside the signed-note one, for ten lines of code.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from lanes_es.domain.jstext import parse_json

from .signing import Signer, Verifier

IN_TOTO_PAYLOAD_TYPE = "application/vnd.in-toto+json"


class EnvelopeError(ValueError):
    """An envelope that does not parse or whose signature does not hold."""


def pae(payload_type: str, body: bytes) -> bytes:
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(body), body)


def sign_envelope(body: bytes, signer: Signer, payload_type: str = IN_TOTO_PAYLOAD_TYPE) -> dict[str, Any]:
    verifier = signer.verifier
    return {"payload": base64.b64encode(body).decode(), "payloadType": payload_type,
            "signatures": [{"keyid": f"{verifier.name}+{verifier.key_id:08x}",
                            "sig": base64.b64encode(signer.sign(pae(payload_type, body))).decode()}]}


def envelope_bytes(envelope: dict[str, Any]) -> bytes:
    return (json.dumps(envelope, indent=2, sort_keys=True) + "\n").encode()


def open_envelope(data: bytes, verifier: Verifier) -> dict[str, Any]:
    """The JSON payload of an envelope signed by `verifier`; EnvelopeError otherwise."""
    try:
        envelope = parse_json(data.decode("utf-8"))
        body = base64.b64decode(envelope["payload"], validate=True)
        payload_type = envelope["payloadType"]
        signatures = [base64.b64decode(item["sig"], validate=True) for item in envelope["signatures"]]
    except (ValueError, KeyError, TypeError, binascii.Error) as error:
        raise EnvelopeError(f"not a DSSE envelope ({error})") from None
    if not any(verifier.verify(pae(payload_type, body), signature) for signature in signatures):
        raise EnvelopeError(f"no signature of {verifier.name}+{verifier.key_id:08x} holds on the envelope")
    try:
        payload = parse_json(body.decode("utf-8"))
    except ValueError:
        raise EnvelopeError("the envelope's payload is not JSON") from None
    if not isinstance(payload, dict):
        raise EnvelopeError("the envelope's payload is not a JSON object")
    return payload
