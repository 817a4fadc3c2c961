"""JavaScript string semantics that upstream's formats depend on.

Upstream measures, trims and sorts strings the JavaScript way: a length counts
UTF-16 code units, `trim()` and `\\s` know their own whitespace set (not
Python's), a default `sort()` compares code units, and hashing a string encodes
lone surrogates as U+FFFD. Limits and digests must agree with upstream on
hostile text too, so the domain uses these helpers instead of Python's builtins.
"""

from __future__ import annotations

import json
import re
from typing import Any

# ECMAScript WhiteSpace and LineTerminator: what `trim()` removes and `\s` matches.
JS_WHITESPACE = (
    "\t\n\v\f\r \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000\ufeff"
)
# A character class body usable inside a regular expression, for `\s`.
WS = "".join(f"\\u{ord(char):04x}" for char in JS_WHITESPACE)
# What `.` does not match in a JavaScript regular expression without the `s` flag.
LINE_TERMINATORS = "\n\r\u2028\u2029"

_LONE_SURROGATE = re.compile(r"[\ud800-\udfff]")
MAX_SAFE_INTEGER = 2**53 - 1


def js_trim(text: str) -> str:
    return text.strip(JS_WHITESPACE)


def js_length(text: str) -> int:
    """`text.length`: UTF-16 code units, so an astral character counts twice."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def code_unit_key(text: str) -> bytes:
    """Sort key of JavaScript's default `sort()`: UTF-16 code units, not code points."""
    return text.encode("utf-16-be", "surrogatepass")


def utf8(text: str) -> bytes:
    """The bytes Node hashes for a string: lone surrogates become U+FFFD."""
    return _LONE_SURROGATE.sub("\ufffd", text).encode("utf-8")


def is_round_trip_utf8(text: str) -> bool:
    """True when the text has no lone surrogate, so its UTF-8 bytes decode to the same text."""
    return _LONE_SURROGATE.search(text) is None


def safe_integer(value: Any) -> int | None:
    """`Number.isSafeInteger(value)` for a JSON value: the int, or None. A bool is not a number."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
        return value
    return None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_json(text: str) -> Any:
    """`JSON.parse`: no NaN or Infinity literals; ValueError on anything it refuses, deep nesting included."""
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except RecursionError as error:
        raise ValueError("JSON nests too deeply") from error


def escape_lone_surrogates(text: str) -> str:
    """Inside JSON text, write lone surrogates as `\\udxxx` escapes, as a well-formed `JSON.stringify` does."""
    return _LONE_SURROGATE.sub(lambda match: f"\\u{ord(match.group()):04x}", text)


def utf8_text(data: bytes) -> str:
    """A text file's bytes as UTF-8 (a BOM kept, as Node's readFileSync keeps it); ValueError saying how it was saved."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
            raise ValueError("is UTF-16 text, not UTF-8; save it as UTF-8") from None
        raise ValueError(f"is not UTF-8 text (byte {error.start}: {error.reason}; Latin-1 or another legacy "
                         f"encoding?); save it as UTF-8") from None


def parse_json_file_text(data: bytes) -> Any:
    """A JSON file's bytes: UTF-8 without a byte-order mark (JSON.parse refuses one), then `parse_json`."""
    text = utf8_text(data)
    if text.startswith("\ufeff"):
        raise ValueError("starts with a byte-order mark (BOM), which JSON does not allow; save it as UTF-8 "
                         "without a BOM")
    return parse_json(text)
