"""The tick's untrusted parameters, shape-checked before anything is read or written.

`max_parallel`, `lane_offers`, `lane_instruction`, `lane_revision` and
`final_verification` arrive as JSON values from a host, a command line or an MCP
client. Each parser returns a small Struct or refuses with `InvalidInput` carrying
upstream's message (docs/upstream.md#entry-and-tool-arguments, #final-verification, #lane-instructions-and-corrections, #delegated-intent-revisions). `None` means the parameter is
absent, as JavaScript's undefined and null both do upstream. A bool is never a number.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from ..errors import Refusal
from .ids import is_valid_id
from .intent import InvalidIntent, parse_task_intent
from .jstext import WS, js_length, js_trim, safe_integer

MAX_LANE_OFFERS = 64
MAX_PATH_LENGTH = 4096
MAX_INSTRUCTION_LENGTH = 4000
MAX_FINAL_VERIFICATION_COMMANDS = 8
MAX_COMMAND_LENGTH = 512
INSTRUCTION_KINDS = ("instruction", "correction")
SESSION_STATES = ("idle", "working", "blocked", "done")
# Upstream's two versions differ: the older refused these as shell syntax, the newer also quoting.
SHELL_SYNTAX = frozenset("|&;<>`$(){}")
QUOTING = frozenset("\"'\\")
_WHITESPACE_RUN = re.compile(f"[{WS}]+")


class InvalidInput(Refusal, ValueError):
    """A tick parameter refused before anything happened; the message is upstream's."""


class LaneOffer(msgspec.Struct, frozen=True, kw_only=True):
    task_id: str
    path: str  # absolute, untrusted until admission reads its facts


class LaneInstruction(msgspec.Struct, frozen=True, kw_only=True):
    task_id: str
    kind: str
    text: str
    session_state: str


class LaneRevision(msgspec.Struct, frozen=True, kw_only=True):
    task_id: str
    next_intent: dict[str, Any]  # a normalized TaskIntent v1


def parse_max_parallel(value: Any) -> int | None:
    return parse_positive_count(value, "max_parallel")


def parse_positive_count(value: Any, name: str) -> int | None:
    """A count the record keeps (max_parallel, max_children, qa_failure_limit): 1 to 2^53-1, as the validator wants."""
    if value is None:
        return None
    number = safe_integer(value)
    if number is None or number <= 0:
        raise InvalidInput(f"invalid {name}: expected a positive integer")  # upstream's words, kept exactly
    return number


def parse_lane_offers(value: Any) -> list[LaneOffer] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise InvalidInput("invalid lane_offers: expected an array")
    if len(value) > MAX_LANE_OFFERS:
        raise InvalidInput(f"invalid lane_offers: at most {MAX_LANE_OFFERS} offers")
    offers: list[LaneOffer] = []
    for entry in value:
        offer = _parse_offer(entry)
        if any(known.task_id == offer.task_id for known in offers):
            raise InvalidInput(f"invalid lane_offers: duplicate offer for {offer.task_id}")
        offers.append(offer)
    return offers


def _parse_offer(entry: Any) -> LaneOffer:
    if not isinstance(entry, dict):
        raise InvalidInput("invalid lane_offers: each offer must be an object")
    if any(key not in ("task_id", "path") for key in entry):
        raise InvalidInput("invalid lane_offers: unknown offer field")
    task_id, path = entry.get("task_id"), entry.get("path")
    if not is_valid_id(task_id):
        raise InvalidInput("invalid lane_offers: task_id is not a valid task id")
    if (not isinstance(path, str) or not path or js_length(path) > MAX_PATH_LENGTH or "\x00" in path
            or not path.startswith("/")):
        raise InvalidInput("invalid lane_offers: path must be an absolute path")
    return LaneOffer(task_id=task_id, path=path)


def parse_lane_instruction(value: Any) -> LaneInstruction | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidInput("invalid lane_instruction: expected an object")
    if any(key not in ("task_id", "kind", "text", "session_state") for key in value):
        raise InvalidInput("invalid lane_instruction: unknown field")
    # Only an absent kind defaults, as a JavaScript destructuring default does; null is refused.
    task_id, kind, text = value.get("task_id"), value.get("kind", "instruction"), value.get("text")
    if not is_valid_id(task_id):
        raise InvalidInput("invalid lane_instruction: task_id is not a valid task id")
    if not isinstance(kind, str) or kind not in INSTRUCTION_KINDS:
        raise InvalidInput("invalid lane_instruction: kind must be instruction or correction")
    if not isinstance(text, str) or not js_trim(text) or js_length(text) > MAX_INSTRUCTION_LENGTH:
        raise InvalidInput(f"invalid lane_instruction: text must be 1 to {MAX_INSTRUCTION_LENGTH} characters")
    session_state = value.get("session_state")
    if not isinstance(session_state, str) or session_state not in SESSION_STATES:
        raise InvalidInput("invalid lane_instruction: session_state must be idle, working, blocked or done")
    return LaneInstruction(task_id=task_id, kind=kind, text=text, session_state=session_state)


def parse_lane_revision(value: Any) -> LaneRevision | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidInput("invalid lane_revision: expected an object")
    if set(value) != {"task_id", "next_intent"}:
        raise InvalidInput("invalid lane_revision: expected exactly task_id and next_intent")
    task_id = value["task_id"]
    if not is_valid_id(task_id):
        raise InvalidInput("invalid lane_revision: task_id is not a valid task id")
    try:
        next_intent = parse_task_intent(value["next_intent"])
    except InvalidIntent as error:
        raise InvalidInput(f"invalid lane_revision: {error}") from None
    if next_intent["task_id"] != task_id:
        raise InvalidInput("invalid lane_revision: next_intent.task_id must equal task_id")
    return LaneRevision(task_id=task_id, next_intent=next_intent)


def parse_final_verification(value: Any) -> list[str] | None:
    """1 to 8 plain argv commands, each stored trimmed with whitespace runs collapsed."""
    if value is None:
        return None
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_FINAL_VERIFICATION_COMMANDS:
        raise InvalidInput(f"invalid final_verification: expected 1 to {MAX_FINAL_VERIFICATION_COMMANDS} commands")
    return [_parse_command(command) for command in value]


def _parse_command(command: Any) -> str:
    if (not isinstance(command, str) or not js_trim(command) or js_length(command) > MAX_COMMAND_LENGTH
            or any(char in command for char in "\x00\r\n")):
        raise InvalidInput(f"invalid final_verification: each command must be 1 to {MAX_COMMAND_LENGTH} "
                           "characters on one line, without NUL")
    if SHELL_SYNTAX.intersection(command):
        raise InvalidInput("invalid final_verification: a command must not use shell syntax "
                           f"({''.join(sorted(SHELL_SYNTAX))}); it runs as plain argv without a shell")
    if QUOTING.intersection(command):
        raise InvalidInput("invalid final_verification: a command must not use quoting (quotes or backslash); "
                           "it is split on spaces into plain argv")
    return _WHITESPACE_RUN.sub(" ", js_trim(command))


def resolve_lane_parallel(max_parallel: int | None, offers_given: bool, instruction_given: bool,
                          recorded_max_parallel: int | None) -> int | None:
    """Offers or an instruction without max_parallel resume the recorded lane batch, whose max_parallel applies.

    `recorded_max_parallel` is the active v2 record's value, None when there is no readable active lane
    batch. Upstream passes a lane_revision as the instruction here.
    """
    if max_parallel is not None or not (offers_given or instruction_given):
        return max_parallel
    if recorded_max_parallel is None:
        name = "lane_offers" if offers_given else "lane_instruction"
        raise InvalidInput(f"{name} requires max_parallel unless a recorded lane batch is being resumed")
    return recorded_max_parallel
