"""Verification descriptor v2: the one command an acceptance item runs, without a shell.

An acceptance item's `verification` is the descriptor's JSON text (or, from a Python
caller, the object itself). The descriptor names an executable, its argv, a
repository-relative cwd and hard limits; the optional environment names a prepare
command and the only directories the run may write. Everything is checked before
anything runs (docs/upstream.md#the-descriptor-rerun-and-deterministic-qa); a retired v1 descriptor asks for a migration.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from .jstext import js_length, parse_json, safe_integer, utf8

DESCRIPTOR_CONTRACT = "assurance_kernel/verification_descriptor/v2"
DESCRIPTOR_V1_CONTRACT = "assurance_kernel/verification_descriptor/v1"
MIGRATION_REQUIRED = "verification_contract_migration_required"
MAX_DESCRIPTOR_BYTES = 64 * 1024
MAX_ARGV, MAX_ARG_BYTES, MAX_PATH_CHARS, MAX_DEPTH, MAX_WRITABLE_PATHS = 64, 512, 512, 32, 32
MAX_TIMEOUT_MS, MAX_OUTPUT_BYTES = 600_000, 262_144
COMMAND_FIELDS = frozenset({"executable", "argv", "cwd", "timeout_ms", "max_output_bytes"})
TOOL_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}")
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
DRIVE_LETTER = re.compile(r"^[A-Za-z]:")


class InvalidDescriptor(ValueError):
    """A descriptor that breaks a v2 rule, or a v1 descriptor that must be migrated."""


class CommandSpec(msgspec.Struct, frozen=True, kw_only=True):
    executable: str
    argv: list[str]
    cwd: str  # repository-relative, normalized; "." is the repository root
    timeout_ms: int
    max_output_bytes: int


class Environment(msgspec.Struct, frozen=True, kw_only=True):
    prepare: CommandSpec | None = None
    writable_paths: list[str] = []


class Descriptor(msgspec.Struct, frozen=True, kw_only=True):
    command: CommandSpec
    environment: Environment = Environment()


def _fail(text: str) -> InvalidDescriptor:
    return InvalidDescriptor(f"verification descriptor {text}")


def parse_verification_descriptor(value: Any) -> Descriptor:
    """The checked descriptor of an acceptance item's `verification` (JSON text or object)."""
    document = _load(value)
    contract = document.get("contract")
    if contract == DESCRIPTOR_V1_CONTRACT:
        raise InvalidDescriptor(f"{MIGRATION_REQUIRED}: verification descriptor {DESCRIPTOR_V1_CONTRACT} "
                                f"must be rewritten as {DESCRIPTOR_CONTRACT}")
    if contract != DESCRIPTOR_CONTRACT:
        raise _fail(f"contract must equal {DESCRIPTOR_CONTRACT}")
    if any(key not in ("contract", "command", "environment") for key in document):
        raise _fail("has an unknown field")
    command = _parse_command(document.get("command"), "command")
    if "environment" not in document:
        return Descriptor(command=command)
    return Descriptor(command=command, environment=_parse_environment(document["environment"]))


def _load(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        if len(utf8(value)) > MAX_DESCRIPTOR_BYTES:
            raise _fail(f"exceeds {MAX_DESCRIPTOR_BYTES} bytes")
        try:
            value = parse_json(value)
        except ValueError as error:
            raise _fail("is not valid JSON") from error
    if not isinstance(value, dict):
        raise _fail("must be a JSON object")
    return value


def _parse_command(value: Any, where: str) -> CommandSpec:
    if not isinstance(value, dict) or set(value) != COMMAND_FIELDS:
        raise _fail(f"{where} must hold exactly executable, argv, cwd, timeout_ms and max_output_bytes")
    return CommandSpec(
        executable=_executable(value["executable"], where),
        argv=_argv(value["argv"], where),
        cwd=repo_relative_path(value["cwd"], f"{where}.cwd"),
        timeout_ms=_bounded(value["timeout_ms"], f"{where}.timeout_ms", MAX_TIMEOUT_MS),
        max_output_bytes=_bounded(value["max_output_bytes"], f"{where}.max_output_bytes", MAX_OUTPUT_BYTES),
    )


def _executable(value: Any, where: str) -> str:
    """A tool name looked up on PATH, or `./<file>` inside the repository."""
    if isinstance(value, str) and TOOL_NAME.fullmatch(value):
        return value
    if isinstance(value, str) and value.startswith("./") and repo_relative_path(value, f"{where}.executable") != ".":
        return value
    raise _fail(f"{where}.executable must be a tool name or ./<repository file>")


def _argv(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or len(value) > MAX_ARGV:
        raise _fail(f"{where}.argv must be an array of at most {MAX_ARGV} strings")
    for index, argument in enumerate(value):
        problem = _argument_problem(argument)
        if problem is not None:
            raise _fail(f"{where}.argv[{index}] {problem}; argv entries must be strings of at most {MAX_ARG_BYTES} "
                        "bytes without control characters")
    return list(value)


def _argument_problem(argument: Any) -> str | None:
    """Why one argv entry breaks the rule, the entry shown escaped (a control character must not reach a terminal)."""
    if not isinstance(argument, str):
        return f"is a JSON {type(argument).__name__}, not a string"
    if len(utf8(argument)) > MAX_ARG_BYTES:
        return f"{_escaped(argument)} is {len(utf8(argument))} bytes long"
    control = CONTROL.search(argument)
    if control is not None:
        return f"{_escaped(argument)} holds the control character {control.group()!r}"
    return None


def _escaped(text: str, limit: int = 80) -> str:
    return repr(text[:limit]) + ("..." if len(text) > limit else "")


def acceptance_problem(intent: dict[str, Any]) -> str | None:
    """The first acceptance item of a parsed TaskIntent whose verification is no valid descriptor v2, as
    `acceptance <id>: <why>`; None when every one would run. (The intent itself is valid: upstream's intent
    validator checks only that `verification` is a string; the descriptor's rules apply when it runs.)"""
    for item in intent["acceptance"]:
        try:
            parse_verification_descriptor(item["verification"])
        except InvalidDescriptor as error:
            return f"acceptance {item['id']}: {error}"
    return None


def _bounded(value: Any, where: str, maximum: int) -> int:
    number = safe_integer(value)
    if number is None or not 1 <= number <= maximum:
        raise _fail(f"{where} must be an integer from 1 to {maximum}")
    return number


def repo_relative_path(value: Any, where: str) -> str:
    """The normalized repository-relative path (`.` segments dropped; "." for the root), or InvalidDescriptor."""
    if (not isinstance(value, str) or js_length(value) > MAX_PATH_CHARS or CONTROL.search(value) or "\\" in value
            or value.startswith(("/", "~")) or DRIVE_LETTER.match(value)):
        raise _fail(f"{where} must be a repository-relative path")
    segments = [segment for segment in value.split("/") if segment not in ("", ".")]
    if any(segment == ".." or segment.lower() == ".git" for segment in segments) or len(segments) > MAX_DEPTH:
        raise _fail(f"{where} must stay inside the repository, outside .git, at most {MAX_DEPTH} deep")
    return "/".join(segments) or "."


def _parse_environment(value: Any) -> Environment:
    if not isinstance(value, dict) or set(value) != {"prepare", "writable_paths"}:
        raise _fail("environment must hold exactly prepare and writable_paths")
    prepare = None if value["prepare"] is None else _parse_command(value["prepare"], "environment.prepare")
    return Environment(prepare=prepare, writable_paths=_writable_paths(value["writable_paths"]))


def _writable_paths(value: Any) -> list[str]:
    if not isinstance(value, list) or len(value) > MAX_WRITABLE_PATHS:
        raise _fail(f"environment.writable_paths must be an array of at most {MAX_WRITABLE_PATHS} paths")
    paths = [repo_relative_path(item, "environment.writable_paths entry") for item in value]
    if "." in paths:
        raise _fail("environment.writable_paths must not name the repository root")
    if len(set(paths)) != len(paths):
        raise _fail("environment.writable_paths must be distinct")
    nested = [path for path in paths if any(path.startswith(other + "/") for other in paths)]
    if nested:
        raise _fail(f"environment.writable_paths must not nest: {nested[0]}")
    return paths
