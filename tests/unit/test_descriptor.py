"""Verification descriptor v2 (docs/upstream.md#the-descriptor-rerun-and-deterministic-qa)."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lanes_es.domain.descriptor import (
    CommandSpec, Descriptor, Environment, InvalidDescriptor, parse_verification_descriptor,
)
from lanes_es.domain.intent import parse_task_intent


def command(**change) -> dict:
    value = {"executable": "bun", "argv": ["-e", "process.exit(0)"], "cwd": ".", "timeout_ms": 60000,
             "max_output_bytes": 4096}
    value.update(change)
    return value


def document(**change) -> dict:
    value = {"contract": "assurance_kernel/verification_descriptor/v2", "command": command(),
             "environment": {"prepare": None, "writable_paths": []}}
    value.update(change)
    return value


def refusal(value: object) -> str:
    with pytest.raises(InvalidDescriptor) as raised:
        parse_verification_descriptor(value)
    return str(raised.value)


def test_the_upstream_fixture_descriptor_parses_from_its_json_text():
    descriptor = parse_verification_descriptor(json.dumps(document()))
    assert descriptor == Descriptor(
        command=CommandSpec(executable="bun", argv=["-e", "process.exit(0)"], cwd=".", timeout_ms=60000,
                            max_output_bytes=4096),
        environment=Environment(prepare=None, writable_paths=[]))


def test_an_object_is_read_as_its_json_text_would_be():
    assert parse_verification_descriptor(document()) == parse_verification_descriptor(json.dumps(document()))


def test_an_acceptance_items_verification_is_the_descriptor_text():
    intent = parse_task_intent({
        "contract": "assurance_kernel/task_intent/v1", "task_id": "t", "goal": "g", "risk": "routine", "revision": 1,
        "owner": "user", "scope_hint": ["a.txt"],
        "acceptance": [{"id": "A1", "assertion": "a", "verification": json.dumps(document())}]})
    descriptor = parse_verification_descriptor(intent["acceptance"][0]["verification"])
    assert descriptor.command.executable == "bun"


def test_environment_is_optional():
    value = document()
    del value["environment"]
    assert parse_verification_descriptor(value).environment == Environment(prepare=None, writable_paths=[])


def test_a_v1_descriptor_asks_for_a_migration():
    message = refusal({"contract": "assurance_kernel/verification_descriptor/v1", "command": "bun test"})
    assert message.startswith("verification_contract_migration_required: ")


@pytest.mark.parametrize("value", ["not json", "[1]", "null", "NaN", '{"a": NaN}', "[" * 100_000 + "]" * 100_000,
                                   3, None, ["x"]])
def test_a_descriptor_must_be_a_json_object(value):
    assert refusal(value).startswith("verification descriptor ")


def test_the_text_is_at_most_64_kib():
    padded = json.dumps(document()) + " " * (64 * 1024)
    assert "exceeds 65536 bytes" in refusal(padded)
    exact = json.dumps(document())
    assert parse_verification_descriptor(exact + " " * (64 * 1024 - len(exact))).command.cwd == "."


@pytest.mark.parametrize("change", [{"contract": "assurance_kernel/verification_descriptor/v3"}, {"extra": 1},
                                    {"command": "bun test"}, {"environment": None}])
def test_top_level_keys_are_exact(change):
    assert refusal(document(**change)).startswith("verification descriptor ")


@pytest.mark.parametrize("change", [
    {"executable": "bun test"}, {"executable": "-rf"}, {"executable": "a" * 129}, {"executable": "/usr/bin/env"},
    {"executable": "./"}, {"executable": "./../x"}, {"executable": "./.git/hooks/x"}, {"executable": 3},
    {"argv": "x"}, {"argv": ["x"] * 65}, {"argv": ["a\nb"]}, {"argv": ["a\x00"]}, {"argv": ["\x7f"]},
    {"argv": ["x" * 513]}, {"argv": ["\u00e9" * 257]}, {"argv": [1]},
    {"cwd": "/abs"}, {"cwd": "~/x"}, {"cwd": "../x"}, {"cwd": "a/../../x"}, {"cwd": ".git"}, {"cwd": "a/.GIT/b"},
    {"cwd": "a\\b"}, {"cwd": "C:/x"}, {"cwd": "a\tb"}, {"cwd": "x" * 513}, {"cwd": "/".join(["d"] * 33)},
    {"cwd": None},
    {"timeout_ms": 0}, {"timeout_ms": 600001}, {"timeout_ms": 1.5}, {"timeout_ms": True}, {"timeout_ms": "10"},
    {"max_output_bytes": 0}, {"max_output_bytes": 262145}, {"max_output_bytes": None},
])
def test_command_rules(change):
    assert refusal(document(command=command(**change))).startswith("verification descriptor command")


def test_command_keys_are_exact():
    missing = command()
    del missing["cwd"]
    assert "exactly" in refusal(document(command=missing))
    assert "exactly" in refusal(document(command=command(env={})))


def test_command_limits_themselves_are_accepted():
    parsed = parse_verification_descriptor(document(command=command(
        executable="./scripts/check.sh", argv=["x" * 512] * 64, cwd="./" + "/".join(["d"] * 32) + "/.",
        timeout_ms=600000, max_output_bytes=262144)))
    assert parsed.command.cwd == "/".join(["d"] * 32)
    assert parsed.command.executable == "./scripts/check.sh"
    assert parse_verification_descriptor(document(command=command(timeout_ms=1, max_output_bytes=1.0))).command.max_output_bytes == 1


def test_cwd_drops_dot_segments():
    assert parse_verification_descriptor(document(command=command(cwd="./a/./b/"))).command.cwd == "a/b"
    assert parse_verification_descriptor(document(command=command(cwd="./"))).command.cwd == "."


def test_environment_prepare_is_a_command_and_writable_paths_are_normalized():
    parsed = parse_verification_descriptor(document(environment={
        "prepare": command(executable="npm", argv=["ci"]), "writable_paths": ["./build/", "node_modules"]}))
    assert parsed.environment.prepare == CommandSpec(executable="npm", argv=["ci"], cwd=".", timeout_ms=60000,
                                                     max_output_bytes=4096)
    assert parsed.environment.writable_paths == ["build", "node_modules"]


@pytest.mark.parametrize("environment", [
    {"prepare": None}, {"writable_paths": []}, {"prepare": None, "writable_paths": [], "x": 1},
    {"prepare": "npm ci", "writable_paths": []},
    {"prepare": command(timeout_ms=0), "writable_paths": []},
    {"prepare": None, "writable_paths": "build"},
    {"prepare": None, "writable_paths": ["."]}, {"prepare": None, "writable_paths": ["./"]},
    {"prepare": None, "writable_paths": ["build", "./build"]},
    {"prepare": None, "writable_paths": ["build", "build/cache"]},
    {"prepare": None, "writable_paths": ["../out"]},
    {"prepare": None, "writable_paths": [f"d{i}" for i in range(33)]},
])
def test_environment_rules(environment):
    assert refusal(document(environment=environment)).startswith("verification descriptor environment")


def test_parsing_does_not_change_the_callers_object():
    value = document()
    before = copy.deepcopy(value)
    parse_verification_descriptor(value)
    assert value == before


JSON_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=12))
JSON_VALUES = st.recursive(JSON_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)), max_leaves=12)
COMMANDS = st.fixed_dictionaries({}, optional={
    "executable": st.one_of(st.sampled_from(["bun", "./x", "./", "a b"]), JSON_VALUES),
    "argv": st.one_of(st.lists(st.text(max_size=6), max_size=3), JSON_VALUES),
    "cwd": st.one_of(st.text(alphabet="a./~\\", max_size=6), JSON_VALUES),
    "timeout_ms": st.one_of(st.integers(min_value=-2, max_value=700000), JSON_VALUES),
    "max_output_bytes": st.one_of(st.integers(min_value=-2, max_value=300000), JSON_VALUES),
})
DOCUMENTS = st.fixed_dictionaries({}, optional={
    "contract": st.sampled_from(["assurance_kernel/verification_descriptor/v2",
                                 "assurance_kernel/verification_descriptor/v1", "x"]),
    "command": st.one_of(COMMANDS, JSON_VALUES),
    "environment": st.one_of(st.fixed_dictionaries({"prepare": st.one_of(st.none(), COMMANDS),
                                                    "writable_paths": st.lists(st.text("ab./", max_size=4))}),
                             JSON_VALUES),
})


@settings(max_examples=400)
@given(st.one_of(DOCUMENTS, JSON_VALUES, DOCUMENTS.map(json.dumps), st.text(max_size=40)))
def test_the_parser_raises_only_invalid_descriptor(value):
    try:
        parsed = parse_verification_descriptor(value)
    except InvalidDescriptor:
        return
    assert 1 <= parsed.command.timeout_ms <= 600000
    assert ".." not in parsed.command.cwd.split("/")
