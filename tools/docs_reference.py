"""The reference pages that are generated from the code, so that they cannot drift from it.

`tools/mkdocs_hooks.py` puts each where its page holds the marker `<!-- generated: NAME -->`:

- `cli`: every command and subcommand, with the very `--help` text the parser prints;
- `exit-codes`: the table of `lanes_es/exit_codes.py`;
- `events`: every event class of the batch and Initiative logs, its version and its fields.
"""

from __future__ import annotations

import argparse
import os
import re
from contextlib import contextmanager
from typing import Any, Callable, Iterator

HELP_COLUMNS = "100"  # argparse wraps to $COLUMNS: fixed, so the page does not depend on who built it


def commands_of(parser: argparse.ArgumentParser, prefix: str = "lanes-es") -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    """(full command, one-line help, parser) of every command and subcommand, depth first, in the parser's order."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield f"{prefix} {name}", helps.get(name) or "", sub
                yield from commands_of(sub, f"{prefix} {name}")


@contextmanager
def _fixed_width() -> Iterator[None]:
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_COLUMNS
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = before


def anchor(command: str) -> str:
    """The page anchor of a command's section (what MkDocs' toc makes of its heading)."""
    return re.sub(r"[^a-z0-9]+", "-", command.lower()).strip("-")


def cli_reference() -> str:
    """Every command of `lanes-es`: its one-line help and its `--help`, as the parser prints them."""
    from lanes_es.cli.main import build_parser

    parser = build_parser("*")
    with _fixed_width():
        sections = [_section("lanes-es", "the global options, and the list of commands", parser.format_help())]
        for command, summary, sub in commands_of(parser):
            sections.append(_section(command, summary, sub.format_help()))
    return "\n".join(sections)


def _section(command: str, summary: str, help_text: str) -> str:
    depth = "#" * (2 + command.count(" ") - 1) if " " in command else "##"
    return f"{depth} {command}\n\n{summary[:1].upper() + summary[1:]}.\n\n```text\n{help_text.rstrip()}\n```\n"


def exit_codes_table() -> str:
    from lanes_es.exit_codes import EXIT_CODE_TABLE

    rows = "\n".join(f"| {code} | {meaning} |" for code, meaning in EXIT_CODE_TABLE)
    return f"| exit | meaning |\n|---|---|\n{rows}\n"


def events_reference() -> str:
    """Each event class: the log it belongs to, its class version, its docstring and its fields with their types."""
    from lanes_es.domain import events

    lines: list[str] = []
    for title, base in (("A batch's log (`LaneBatch`)", _batch_event),
                        ("An Initiative's log (`Initiative`)", _initiative_event)):
        lines += [f"## {title}", ""]
        for cls in _event_classes(events):
            if base(cls, events):
                lines += _event_lines(cls)
    return "\n".join(lines + _payload_lines(events))


def _event_classes(events: Any) -> list[type]:
    found = [value for value in vars(events).values()
             if isinstance(value, type) and issubclass(value, events._EventFields)
             and value not in (events._EventFields, events.Event, events.CreatedEvent)
             and value.__module__ == events.__name__]
    return sorted(found, key=lambda cls: _source_line(cls))


def _source_line(cls: type) -> int:
    import inspect

    return inspect.getsourcelines(cls)[1]


def _batch_event(cls: type, events: Any) -> bool:
    return not _initiative_event(cls, events)


def _initiative_event(cls: type, events: Any) -> bool:
    return _source_line(cls) >= _source_line(events.InitiativeRegistered)


def _event_lines(cls: type) -> list[str]:
    import inspect

    version = getattr(cls, "class_version", 1)
    doc = inspect.cleandoc(cls.__doc__ or "") if cls.__doc__ and "__doc__" in vars(cls) else ""
    lines = [f"### {cls.__name__}", ""]
    if doc:
        lines += [doc, ""]
    if version > 1:
        lines += [f"Class version {version} (older versions are upcast as they are read).", ""]
    return lines + _field_table(cls)


def _field_table(cls: type) -> list[str]:
    fields = _fields(cls)
    if not fields:
        return ["No fields of its own.", ""]
    return ["| field | type |", "|---|---|", *(f"| `{name}` | `{_escape(kind)}` |" for name, kind in fields), ""]


def _payload_lines(events: Any) -> list[str]:
    """The values events carry (`Budget`, `PlanChild`, ...), each with its fields."""
    found = [value for value in vars(events).values()
             if isinstance(value, type) and issubclass(value, events.Payload) and value is not events.Payload
             and value.__module__ == events.__name__]
    lines = ["## The values inside events", ""]
    for cls in sorted(found, key=_source_line):
        doc = cls.__doc__ if "__doc__" in vars(cls) and cls.__doc__ else ""
        lines += [f"### {cls.__name__}", "", *([doc.strip(), ""] if doc else []), *_field_table(cls)]
    return lines


def _fields(cls: type) -> list[tuple[str, str]]:
    """The Struct's fields in order, each with its annotation as written in the source."""
    import msgspec

    written: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        written.update({key: str(value) for key, value in vars(klass).get("__annotations__", {}).items()})
    return [(field.name, written.get(field.name, "")) for field in msgspec.structs.fields(cls)
            if field.name not in COMMON_FIELDS]


# every event has these (the store's and the chain's); the page says so once
COMMON_FIELDS = frozenset({"originator_id", "originator_version", "timestamp", "at", "digest", "originator_topic"})


def _escape(text: str) -> str:
    return text.replace("|", "\\|")


GENERATORS: dict[str, Callable[[], str]] = {
    "cli": cli_reference,
    "exit-codes": exit_codes_table,
    "events": events_reference,
}
MARKER = re.compile(r"<!-- generated: ([a-z-]+) -->")


def fill(markdown: str) -> str:
    """The page with each `<!-- generated: NAME -->` marker replaced by its generated text."""
    return MARKER.sub(lambda found: GENERATORS[found.group(1)](), markdown)
