"""The documentation site builds with `mkdocs build --strict`: a broken link, a missing anchor, a page
left out of the nav or a generated reference that fails to render fails the suite.

The generated pages are checked against the code they come from: every command of the parser has
its section, and the JSON Schemas agree with the parsers on valid and invalid files.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                           cwd=PROJECT, capture_output=True, text=True, timeout=300,
                           env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert built.returncode == 0, built.stdout + built.stderr
    return out


def test_the_site_builds_strictly(site: Path) -> None:
    assert (site / "index.html").is_file()
    assert (site / "reference" / "schemas" / "task-intent.schema.json").is_file()


def test_every_command_has_its_generated_section(site: Path) -> None:
    from lanes_es.cli.main import build_parser
    from tools.docs_reference import commands_of

    page = (site / "reference" / "cli" / "index.html").read_text()
    for command, _, sub in commands_of(build_parser("*")):
        assert f">{command}<" in page, f"{command} has no section on the commands page"
        assert sub.format_usage().split()[1] in page


def test_the_exit_code_page_holds_the_table(site: Path) -> None:
    from lanes_es.exit_codes import EXIT_CODE_TABLE

    page = (site / "reference" / "exit-codes" / "index.html").read_text()
    for code, _ in EXIT_CODE_TABLE:
        assert f"<td>{code}</td>" in page


def test_every_event_class_is_on_the_events_page(site: Path) -> None:
    from lanes_es.domain.events import ALL_EVENTS

    page = (site / "reference" / "events" / "index.html").read_text()
    for event in ALL_EVENTS:
        assert f">{event.__name__}<" in page


# ---------------------------------------------------------------- JSON Schemas of the file formats


def _validator(name: str):  # noqa: ANN202 - jsonschema's validator type
    from jsonschema import Draft202012Validator
    from referencing import Registry, Resource

    schemas = PROJECT / "docs" / "reference" / "schemas"
    registry = Registry().with_resources(
        (path.name, Resource.from_contents(json.loads(path.read_text()))) for path in schemas.glob("*.json"))
    schema = json.loads((schemas / name).read_text())
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, registry=registry)


def _demo_intent() -> dict:
    from lanes_es.cli.demo import TASKS, intent_json

    return json.loads(intent_json(next(iter(TASKS))))


INVALID_INTENTS = {
    "unknown field": lambda i: i.update(extra=1),
    "empty acceptance": lambda i: i.update(acceptance=[]),
    "risk": lambda i: i.update(risk="low"),
    "revision 0": lambda i: i.update(revision=0),
    "owner": lambda i: i.update(owner="agent"),
    "scope is the root": lambda i: i.update(scope_hint=["."]),
    "scope leaves the repository": lambda i: i.update(scope_hint=["../x"]),
    "absolute scope": lambda i: i.update(scope_hint=["/etc"]),
    "scope with spaces around": lambda i: i.update(scope_hint=[" src"]),
    "verification not a string": lambda i: i["acceptance"][0].update(verification={"contract": "x"}),
}


def test_the_intent_schema_takes_what_the_parser_takes() -> None:
    from lanes_es.domain.intent import parse_task_intent

    intent = _demo_intent()
    parse_task_intent(intent)
    assert not list(_validator("task-intent.schema.json").iter_errors(intent))


@pytest.mark.parametrize("case", sorted(INVALID_INTENTS))
def test_the_intent_schema_refuses_what_the_parser_refuses(case: str) -> None:
    from lanes_es.domain.intent import InvalidIntent, parse_task_intent

    intent = _demo_intent()
    INVALID_INTENTS[case](intent)
    with pytest.raises(InvalidIntent):
        parse_task_intent(intent)
    assert list(_validator("task-intent.schema.json").iter_errors(intent)), case


INVALID_DESCRIPTORS = {
    "v1": lambda d: d.update(contract="assurance_kernel/verification_descriptor/v1"),
    "unknown field": lambda d: d.update(shell=True),
    "executable with a space": lambda d: d["command"].update(executable="python 3"),
    "absolute executable": lambda d: d["command"].update(executable="/bin/sh"),
    "cwd outside": lambda d: d["command"].update(cwd="../x"),
    "cwd in .git": lambda d: d["command"].update(cwd=".git/hooks"),
    "argv control character": lambda d: d["command"].update(argv=["a\nb"]),
    "timeout too long": lambda d: d["command"].update(timeout_ms=600_001),
    "output too large": lambda d: d["command"].update(max_output_bytes=262_145),
    "writable root": lambda d: d["environment"].update(writable_paths=["."]),
    "environment half": lambda d: d.update(environment={"prepare": None}),
}


def _demo_descriptor() -> dict:
    return json.loads(_demo_intent()["acceptance"][0]["verification"])


def test_the_descriptor_schema_takes_what_the_parser_takes() -> None:
    from lanes_es.domain.descriptor import parse_verification_descriptor

    descriptor = _demo_descriptor()
    parse_verification_descriptor(descriptor)
    assert not list(_validator("verification-descriptor.schema.json").iter_errors(descriptor))


@pytest.mark.parametrize("case", sorted(INVALID_DESCRIPTORS))
def test_the_descriptor_schema_refuses_what_the_parser_refuses(case: str) -> None:
    from lanes_es.domain.descriptor import InvalidDescriptor, parse_verification_descriptor

    descriptor = _demo_descriptor()
    INVALID_DESCRIPTORS[case](descriptor)
    with pytest.raises(InvalidDescriptor):
        parse_verification_descriptor(descriptor)
    assert list(_validator("verification-descriptor.schema.json").iter_errors(descriptor)), case


# ---------------------------------------------------------------- references point inside the repository

OUTSIDE = re.compile(r"contracts(\.md)? ?§|contracts\.md|ADR 00(?!01)\d\d|#1\d\d\b|shared/spec|spec/contracts|"
                     r"scenarios(\.md)? §|DESIGN(\.md)? §|LIBRARIES\.md")
# a page of this site (a user's docs/initiatives/ and docs/plans/ are not)
CITED = re.compile(r"docs/((?:how-to/|concepts/|reference/|adr/)[\w.-]+\.md|(?:upstream|architecture|audit|benchmarks|"
                   r"development|tutorial|index)\.md)((?:#[\w-]+)(?:, #[\w-]+)*)?")


def _anchors_of(page: Path) -> set[str]:
    from markdown.extensions.toc import slugify

    headings = re.findall(r"^#{1,6} (.+?)\s*$", page.read_text(encoding="utf-8"), flags=re.M)
    return {slugify(heading, "-") for heading in headings}


def test_code_docs_and_help_cite_only_what_the_repository_holds() -> None:
    """No citation of a document outside the repository; every `docs/PAGE.md#anchor` cited exists."""
    listed = subprocess.run(["git", "ls-files"], cwd=PROJECT, capture_output=True, text=True, check=True).stdout
    outside, missing = [], []
    for name in listed.split():
        path = PROJECT / name
        if not name.endswith((".py", ".md", ".yml", ".toml")) or name.startswith("tests/fixtures/") or not path.is_file():
            continue
        text = path.read_text(encoding="utf-8")
        outside += [f"{name}: {found.group(0)}" for found in OUTSIDE.finditer(text)
                    if name != "tests/integration/test_docs.py"]
        for found in CITED.finditer(text):
            page = PROJECT / "docs" / found.group(1)
            anchors = re.findall(r"#([\w-]+)", found.group(2) or "")
            if not page.is_file():
                missing.append(f"{name}: {found.group(0)}")
            elif anchors and not set(anchors) <= _anchors_of(page):
                missing.append(f"{name}: {found.group(0)} (no such heading)")
    assert not outside, outside
    assert not missing, missing
