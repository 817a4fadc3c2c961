"""`lanes-es mcp` as an agent host meets it: a subprocess on stdio, driven by the MCP SDK's client.

The test plays the host's other roles by hand: the user (answering the elicitation), the
Lane Steward (git worktree add / remove) and the Executor (an edit, then `lanes-es task submit`).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterator

import anyio
import pytest

if TYPE_CHECKING:
    import mcp_types as types
    from mcp import Client

from tests.engine import Task, initiative_markdown
from tests.gitfixtures import all_refs, coordinator, head, intent_json, make_repo, requires_file, run_git, write_file

# Every test here goes through the store: run each on SQLite and on PostgreSQL (tests/conftest.py).
pytestmark = [pytest.mark.usefixtures("store_url"), pytest.mark.coordinator_worktree]

PROJECT = Path(__file__).resolve().parents[2]
SLUG = "init"
STATUS_TOOL = "batch_status"
TASKS = {"task-a": Task(["a.txt"]), "task-b": Task(["b.txt"]), "task-c": Task(["c.txt"], blocked_by=["task-a"])}


@pytest.fixture
def repo(tmp_path: Path) -> str:
    intents = {task: intent_json(task, spec.scope, verification=requires_file(spec.scope[0]))
               for task, spec in TASKS.items()}
    return make_repo(tmp_path / "repo", intents=intents,
                     files={f"docs/initiatives/{SLUG}.md": initiative_markdown(TASKS)})


class User:
    """The user behind the host's elicitation: answers as scripted, and remembers what was asked.
    `meanwhile(message)` runs while the user is being asked: the world moving before the answer."""

    def __init__(self, action: str = "accept", confirm: bool = True, delegate: bool = False,
                 meanwhile: Any = None) -> None:
        self.action, self.confirm, self.delegate, self.meanwhile = action, confirm, delegate, meanwhile
        self.asked: list[types.ElicitRequestFormParams] = []

    async def __call__(self, context: Any, params: Any) -> types.ElicitResult:
        import mcp_types as types

        self.asked.append(params)
        if self.meanwhile is not None:
            self.meanwhile(params.message)
        if self.action != "accept":
            return types.ElicitResult(action=self.action)
        return types.ElicitResult(action="accept", content={"confirm": self.confirm,
                                                            "delegate_in_lane_revisions": self.delegate})


@asynccontextmanager
async def host(root: str, tmp_path: Path, user: User | None = None, mode: str = "auto") -> AsyncIterator[Client]:
    # The MCP SDK (the project's `mcp` extra: CI installs it) is imported here, not at the top: each xdist
    # worker imports every test module, and the SDK's 40 MB there would make each git spawn the worker
    # forks (sh forks the whole interpreter) cost more in every other test.
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters, stdio_client

    params = StdioServerParameters(command=sys.executable, args=["-m", "lanes_es.cli.main", "--root", root, "mcp"],
                                   env=dict(os.environ), cwd=str(PROJECT))
    with open(tmp_path / "server.stderr", "a") as errlog:
        async with Client(stdio_client(params, errlog=errlog), elicitation_callback=user, mode=mode) as client:
            yield client


async def call(client: Client, tool: str, **arguments: Any) -> tuple[bool, dict[str, Any]]:
    result = await client.call_tool(tool, arguments)
    payload = result.structured_content
    assert payload == json.loads(result.content[0].text)  # the same object as text, for hosts without structure
    return bool(result.is_error), payload


def store_events(root: str) -> int:
    """How many events the Initiative's store holds (0 when it was never written)."""
    from lanes_es.bootstrap import bootstrap

    store = bootstrap(root).store
    try:
        return len(store.app.recorder.select_notifications(start=1, limit=100_000))
    finally:
        store.close()


def cli(*args: str) -> int:
    from lanes_es.cli.main import main

    with contextlib.redirect_stdout(io.StringIO()):
        return main(list(args))


# ---------------------------------------------------------------- the tool list


def test_the_four_tools_carry_upstreams_input_schemas(repo, tmp_path):
    async def main() -> list[types.Tool]:
        async with host(repo, tmp_path) as client:
            return (await client.list_tools()).tools

    tools = {tool.name: tool for tool in anyio.run(main)}
    assert sorted(tools) == ["batch_status", "batch_timeline", "retire_stale_batch", "start_unattended_batch"]
    start = tools["start_unattended_batch"].input_schema
    properties = start["properties"]
    assert start["required"] == ["initiative_slug"]
    assert properties["initiative_slug"]["type"] == "string"
    assert {k: properties["max_parallel"][k] for k in ("type", "minimum")} == {"type": "integer", "minimum": 1}
    offer = properties["lane_offers"]["items"]
    assert properties["lane_offers"]["type"] == "array"
    assert offer["properties"] == {"task_id": {"type": "string"}, "path": {"type": "string"}}
    assert offer["required"] == ["task_id", "path"] and offer["additionalProperties"] is False
    final = properties["final_verification"]
    assert (final["type"], final["minItems"], final["maxItems"], final["items"]) == ("array", 1, 8, {"type": "string"})
    instruction = properties["lane_instruction"]
    assert instruction["properties"]["kind"]["enum"] == ["instruction", "correction"]
    assert instruction["properties"]["session_state"]["enum"] == ["idle", "working", "blocked", "done"]
    assert instruction["required"] == ["task_id", "text", "session_state"]
    assert instruction["additionalProperties"] is False
    revision = properties["lane_revision"]["properties"]
    assert revision == {"task_id": {"type": "string"}, "next_intent": {"type": "object"}}
    assert "executor_runtime" not in properties  # not exposed through MCP (docs/upstream.md#authorization-reuse-and-the-tool-surface)
    assert tools["retire_stale_batch"].input_schema["required"] == ["initiative_slug"]
    assert tools["retire_stale_batch"].annotations.destructive_hint is True
    for name in ("batch_status", "batch_timeline"):
        assert tools[name].annotations.read_only_hint is True
        assert tools[name].input_schema["required"] == ["initiative_slug"]


# ---------------------------------------------------------------- refusals before any gate or write


BAD_CALLS = [
    ({"max_parallel": 0}, "invalid max_parallel: expected a positive integer"),
    ({"max_parallel": -1}, "invalid max_parallel: expected a positive integer"),
    ({"max_parallel": 1.5}, "invalid max_parallel: expected a positive integer"),
    ({"max_parallel": "1"}, "invalid max_parallel: expected a positive integer"),
    ({"max_parallel": True}, "invalid max_parallel: expected a positive integer"),
    ({"lane_offers": []}, "lane_offers requires max_parallel unless a recorded lane batch is being resumed"),
    ({"max_parallel": 1, "lane_offers": "x"}, "invalid lane_offers: expected an array"),
    ({"max_parallel": 1, "lane_offers": [{"task_id": "task-a", "path": "relative"}]},
     "invalid lane_offers: path must be an absolute path"),
    ({"max_parallel": 1, "lane_offers": [{"task_id": "../escape", "path": "/tmp/x"}]},
     "invalid lane_offers: task_id is not a valid task id"),
    ({"max_parallel": 1, "lane_offers": [{"task_id": "task-a", "path": "/tmp/x", "extra": 1}]},
     "invalid lane_offers: unknown offer field"),
    ({"max_parallel": 1, "lane_offers": [{"task_id": "task-a", "path": "/tmp/x"}, {"task_id": "task-a", "path": "/tmp/y"}]},
     "invalid lane_offers: duplicate offer for task-a"),
    ({"max_parallel": 1, "lane_instruction": {"task_id": "task-a", "text": "go", "session_state": "asleep"}},
     "invalid lane_instruction: session_state must be idle, working, blocked or done"),
    ({"max_parallel": 1, "final_verification": []}, "invalid final_verification: expected 1 to 8 commands"),
]


def test_invalid_max_parallel_and_lane_offers_are_refused_with_upstreams_messages_and_nothing_written(repo, tmp_path):
    """Ports LANE-INP-05 and LANE-INP-06."""
    refs, coordinator_head, events = all_refs(repo), head(repo), store_events(repo)
    user = User()

    async def main() -> list[tuple[bool, dict[str, Any]]]:
        async with host(repo, tmp_path, user) as client:
            return [await call(client, "start_unattended_batch", initiative_slug=SLUG, **arguments)
                    for arguments, _ in BAD_CALLS]

    results = anyio.run(main)
    for (arguments, message), (is_error, payload) in zip(BAD_CALLS, results):
        assert is_error, arguments
        assert payload["state"] == "rejected" and payload["reason_key"] == "invalid_input", arguments
        assert payload["reason"] == message, arguments
        assert "call start_unattended_batch again" in payload["recovery_action"]
    assert user.asked == []  # no gate opened
    assert not (Path(repo) / ".imm" / "state" / "batches").exists()
    assert store_events(repo) == events == 0
    assert all_refs(repo) == refs and head(repo) == coordinator_head


def test_a_damaged_store_is_a_refusal_naming_it_and_verify_not_an_internal_error(repo, tmp_path):
    """A store error after the server opened the store (here an event edited outside lanes-es) reaches the host
    as the store's own one-line reason, classified: not `internal_error`, which says "a bug, report this"."""
    from tests.store_rows import StoreRows, store_url_of

    assert cli("--root", repo, "authorize", SLUG, "--yes", "--max-parallel", "2") == 0
    assert cli("--root", repo, "tick", SLUG) == 0

    async def main() -> list[tuple[bool, dict[str, Any]]]:
        async with host(repo, tmp_path) as client:
            fine = await call(client, STATUS_TOOL, initiative_slug=SLUG)
            rows = StoreRows(store_url_of(repo))
            batch_id = fine[1]["batch_id"]
            assert rows.execute("UPDATE {events} SET topic = 'nope:X' WHERE originator_id = ? AND "
                                "originator_version = 2", batch_id) == 1
            return [fine, await call(client, STATUS_TOOL, initiative_slug=SLUG)]

    (ok, _), (is_error, payload) = anyio.run(main)
    assert not ok and is_error
    assert payload["reason_key"] == "store_unavailable", payload
    assert "does not verify (version 2: undecodable" in payload["reason"] and "lanes-es verify batch-" in payload["reason"]
    assert "call batch_status again" in payload["recovery_action"]


# ---------------------------------------------------------------- a whole batch


def provision(root: str, lanes: Path, handoff: dict[str, Any]) -> str:
    lane = lanes / handoff["task_id"]
    lanes.mkdir(parents=True, exist_ok=True)
    run_git(root, "worktree", "add", "-q", "-b", handoff["lane_branch"], str(lane), handoff["base_head"])
    return os.path.realpath(lane)


def execute(handoff: dict[str, Any]) -> None:
    """The Executor: deliver the file the acceptance asks for, then submit."""
    scope = TASKS[handoff["task_id"]].scope[0]
    write_file(handoff["lane_path"], scope, f"{handoff['task_id']} delivered\n")
    assert cli("--root", handoff["lane_path"], "task", "submit") == 0


@pytest.mark.coordinator_worktree
def test_a_batch_of_three_runs_to_completed_through_start_unattended_batch(repo, tmp_path):
    """Ports LANE-INP-10 and LANE-DEL-01, in the default mode: the start tool makes the batch's coordinator
    worktree, every later call finds it, and the server's checkout stays on main."""
    user = User()
    lanes = tmp_path / "lanes"

    async def main() -> list[dict[str, Any]]:
        results: list[dict[str, Any]] = []
        async with host(repo, tmp_path, user) as client:
            is_error, payload = await call(client, "start_unattended_batch", initiative_slug=SLUG, max_parallel=2)
            results.append(payload)
            mismatch = await call(client, "start_unattended_batch", initiative_slug=SLUG, max_parallel=1, lane_offers=[])
            results.append(mismatch[1])
            for _ in range(12):
                report = payload["report"]
                assert not is_error and payload["state"] == "started", payload
                if report["batch_state"] == "completed":
                    break
                offers = []
                for handoff in report["handoffs"]:
                    if handoff["role"] == "lane-steward" and handoff["action"] == "provision":
                        offers.append({"task_id": handoff["task_id"], "path": provision(repo, lanes, handoff)})
                    elif handoff["role"] == "lane-steward":
                        run_git(repo, "worktree", "remove", str(lanes / handoff["task_id"]))
                    elif handoff["role"] == "executor":
                        execute(handoff)
                arguments = {"lane_offers": offers} if offers else {}  # resumes with the recorded max_parallel
                is_error, payload = await call(client, "start_unattended_batch", initiative_slug=SLUG, **arguments)
                results.append(payload)
            results.append((await call(client, "batch_status", initiative_slug=SLUG))[1])
            results.append((await call(client, "batch_timeline", initiative_slug=SLUG))[1])
        return results

    first, mismatch, *ticks, status, timeline = anyio.run(main)
    last = ticks[-1]
    assert mismatch["state"] == "rejected" and mismatch["reason_key"] == "batch_run_rejected"  # LANE-INP-08
    assert mismatch["reason"] == "batch_parallel_mismatch: the recorded batch runs with max_parallel 2"
    assert mismatch["report"]["batch_state"] == "rejected"
    assert len(user.asked) == 1  # confirmed once, then every call runs under that authorization
    message = user.asked[0].message
    assert all(task in message for task in TASKS) and "max_parallel=2" in message
    assert user.asked[0].requested_schema["properties"]["delegate_in_lane_revisions"]["default"] is False
    assert first["confirmed"]["batch_id"] == first["batch_id"] and first["confirmed"]["delegate_revisions"] is False
    assert [h["task_id"] for h in first["report"]["handoffs"]] == ["task-a", "task-b"]  # task-c waits for task-a
    report = last["report"]
    assert report["batch_state"] == "completed" and report["reason"] == "all enrollable children integrated"
    assert report["max_parallel"] == 2
    assert len(report["commits"]) == 3 and len(set(report["commits"])) == 3
    assert run_git(repo, "rev-parse", f"imm/{SLUG}").stdout.decode().strip() == report["commits"][-1]
    assert status["state"] == "status" and status["batch_state"] == "completed"
    assert status["record"]["commits"] == report["commits"] and status["report"]["batch_state"] == "completed"
    rows = timeline["rows"]
    assert rows[0]["event"] == "BatchPrepared" and rows[-1]["event"] == "BatchSettled"
    assert [row["version"] for row in rows] == list(range(1, len(rows) + 1))
    assert sorted(row["task_id"] for row in rows if row["transition"] == "integrated") == sorted(TASKS)
    coordinator = Path(repo, ".git", "lanes-es", "coordinators", SLUG)
    assert run_git(coordinator, "branch", "--show-current").stdout.decode().strip() == f"imm/{SLUG}"
    assert run_git(repo, "status", "--porcelain=v1", "--branch").stdout.decode() == "## main\n"


# ---------------------------------------------------------------- the gate


def test_without_elicitation_the_facts_come_back_with_the_command_that_confirms_them(repo, tmp_path):
    """Ports LANE-GRP-08."""
    async def ask_then_retry(after_refusal: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        async with host(repo, tmp_path, user=None) as client:
            refused = (await call(client, "start_unattended_batch", initiative_slug=SLUG, max_parallel=2))[1]
            after_refusal(refused)
            return refused, (await call(client, "start_unattended_batch", initiative_slug=SLUG))[1]

    def confirm_as_told(refused: dict[str, Any]) -> None:
        assert not (Path(repo) / ".imm" / "state" / "batches").exists() and store_events(repo) == 0
        command = refused["recovery_action"].split("`")[1]
        assert command == f"lanes-es --root {repo} authorize {SLUG} --max-parallel 2 --yes"
        assert cli(*command.split()[1:]) == 0  # what the user runs in the coordinator

    refused, started = anyio.run(ask_then_retry, confirm_as_told)
    assert refused["state"] == "rejected" and refused["reason_key"] == "confirmation_port_unavailable"
    facts = refused["confirmation"]
    assert [child["task_id"] for child in facts["children"]] == list(TASKS)
    assert facts["lane_mode"]["max_parallel"] == 2 and facts["lane_mode"]["offer_revision_delegation"] is True
    assert started["state"] == "started" and started["report"]["batch_state"] == "running"
    assert "confirmed" not in started  # it ran under the authorization the command recorded


@pytest.mark.coordinator_worktree  # the question made a coordinator worktree: the refusal takes it away
@pytest.mark.parametrize("answer", ["decline", "cancel", "unconfirmed"])
def test_a_declined_or_cancelled_confirmation_writes_nothing(repo, tmp_path, answer):
    user = User(action="accept", confirm=False) if answer == "unconfirmed" else User(action=answer)

    async def main() -> tuple[bool, dict[str, Any]]:
        async with host(repo, tmp_path, user, mode="legacy") as client:  # elicitation sent mid-call (2025 era)
            return await call(client, "start_unattended_batch", initiative_slug=SLUG, max_parallel=1)

    is_error, payload = anyio.run(main)
    assert is_error and len(user.asked) == 1
    expected = ("cancelled", "confirmation_cancelled") if answer == "cancel" else ("rejected", "confirmation_declined")
    assert (payload["state"], payload["reason_key"]) == expected
    assert not (Path(repo) / ".imm" / "state" / "batches").exists() and store_events(repo) == 0
    assert not (Path(repo) / ".git" / "lanes-es" / "coordinators").exists()
    assert not list((Path(repo) / ".git" / "worktrees").glob("*")), "a coordinator worktree was left"


def test_retire_stale_batch_is_refused_while_a_child_is_in_flight_before_any_gate(repo, tmp_path):
    """Ports LANE-DISP-05."""
    user = User()
    lanes = tmp_path / "lanes"

    async def main() -> list[tuple[bool, dict[str, Any]]]:
        async with host(repo, tmp_path, user) as client:
            _, started = await call(client, "start_unattended_batch", initiative_slug=SLUG, max_parallel=1)
            handoff = started["report"]["handoffs"][0]
            offer = {"task_id": handoff["task_id"], "path": provision(repo, lanes, handoff)}
            await call(client, "start_unattended_batch", initiative_slug=SLUG, lane_offers=[offer])
            asked = len(user.asked)
            in_flight = await call(client, "retire_stale_batch", initiative_slug=SLUG)
            assert len(user.asked) == asked  # refused before the gate
            return [in_flight]

    (is_error, payload), = anyio.run(main)
    assert is_error and payload["state"] == "blocked" and payload["reason_key"] == "stale_batch_in_flight"
    assert "mid-flight" in payload["reason"] and "settle or stop the in-flight child" in payload["recovery_action"]


def test_retire_stale_batch_asks_the_user_then_supersedes_the_batch(repo, tmp_path):
    """Ports LANE-DISP-08."""
    user = User()

    async def main() -> list[tuple[bool, dict[str, Any]]]:
        async with host(repo, tmp_path, user) as client:
            started = await call(client, "start_unattended_batch", initiative_slug=SLUG, max_parallel=2)
            retired = await call(client, "retire_stale_batch", initiative_slug=SLUG)
            again = await call(client, "retire_stale_batch", initiative_slug=SLUG)
            return [started, retired, again]

    (_, started), (retired_error, retired), (again_error, again) = anyio.run(main)
    assert len(user.asked) == 2 and started["batch_id"] in user.asked[1].message
    assert not retired_error and retired["state"] == "retired" and retired["batch_id"] == started["batch_id"]
    assert retired["report"]["batch_state"] == "superseded" and retired["report"]["handoffs"] == []
    from lanes_es.bootstrap import bootstrap

    assert bootstrap(repo, read_only=True).store.batch(started["batch_id"]).batch_state == "superseded"
    assert not coordinator(repo, SLUG).exists()  # retired: its clean coordinator worktree went with it
    assert again_error and again["reason_key"] == "stale_batch_absent"


# ---------------------------------------------------------------- after the gate, in both elicitation modes
# "auto": the 2026-07-28 multi-round form (an input-required result, the answer in a second call carrying the
# sealed request state); "legacy": the elicitation sent in the middle of the call.

MODES = ["auto", "legacy"]


def user_commit(repo: str, path: str, text: str) -> str:
    """A commit of the user's own on the checkout's branch (the batch branch once the batch started)."""
    write_file(repo, path, text)
    run_git(repo, "add", path)
    run_git(repo, "commit", "-q", "-m", f"the user's {path}")
    return head(repo)


@pytest.mark.parametrize("mode", MODES)
def test_a_users_fast_forward_is_adopted_and_retire_refuses_a_record_that_changed_while_asked(repo, tmp_path, mode,
                                                                                            monkeypatch):
    """A user's commit on imm/<slug> is adopted by the next call under the same authorization (no second gate,
    `adopted_heads`, the Lane cut from the adopted head). retire_stale_batch then asks the user; while the user is
    asked, the user's next commit is adopted by a tick (the record changes): the retirement is refused after the
    gate, with upstream's words, on the record the user was asked about, and nothing is retired."""
    monkeypatch.setenv("LANES_ES_COORDINATOR", ".")  # the user commits on imm/<slug> in the coordinator checkout
    moved: dict[str, str] = {}

    def meanwhile(message: str) -> None:
        if message.startswith("Retire batch"):
            moved["head"] = user_commit(repo, "notes/two.txt", "two\n")
            assert cli("--root", repo, "tick", SLUG) == 0

    user = User(meanwhile=meanwhile)

    async def main() -> list[tuple[bool, dict[str, Any]]]:
        async with host(repo, tmp_path, user, mode=mode) as client:
            started = await call(client, "start_unattended_batch", initiative_slug=SLUG, max_parallel=2)
            moved["base"] = started[1]["report"]["handoffs"][0]["base_head"]
            moved["first"] = user_commit(repo, "notes/one.txt", "one\n")
            adopted = await call(client, "start_unattended_batch", initiative_slug=SLUG)
            return [started, adopted, await call(client, "retire_stale_batch", initiative_slug=SLUG)]

    (_, started), (adopted_error, adopted), (retire_error, retired) = anyio.run(main)
    assert not adopted_error and adopted["state"] == "started" and "confirmed" not in adopted
    report = adopted["report"]
    assert report["batch_state"] == "running" and report["reason"] is None
    assert {h["base_head"] for h in report["handoffs"]} == {moved["first"]}  # the Lanes start from the adopted head
    assert len(user.asked) == 2 and user.asked[1].message.startswith("Retire batch")  # no gate for the adoption
    assert retire_error and (retired["state"], retired["reason_key"]) == ("rejected", "plan_changed"), retired
    assert retired["reason"] == (f"batch run state {started['batch_id']} changed after native confirmation; "
                                 f"nothing was retired")
    assert "retire_stale_batch again" in retired["recovery_action"] and "lanes-es" not in retired["recovery_action"]
    record = json.loads((Path(repo) / ".imm" / "state" / "batches" / f"{started['batch_id']}.json").read_text())
    assert record["batch_state"] == "running"
    assert record["adopted_heads"] == [{"from": moved["base"], "to": moved["first"]},
                                       {"from": moved["first"], "to": moved["head"]}]


@pytest.mark.parametrize("mode", MODES)
def test_a_plan_or_head_that_moves_while_the_user_is_asked_is_refused_after_the_gate(repo, tmp_path, mode):
    """upstream re-checks after its native gate and refuses, with `plan_changed` (the Initiative edited) or
    `head_moved` (a commit on the coordinator's branch); the user is asked once per call and nothing is recorded."""
    moves = iter([lambda: user_commit(repo, f"docs/initiatives/{SLUG}.md",
                                      initiative_markdown({k: v for k, v in TASKS.items() if k != "task-b"})),
                  lambda: user_commit(repo, "notes/user.txt", "mine\n")])
    user = User(meanwhile=lambda message: next(moves)())

    async def main() -> list[tuple[bool, dict[str, Any]]]:
        async with host(repo, tmp_path, user, mode=mode) as client:
            return [await call(client, "start_unattended_batch", initiative_slug=SLUG, max_parallel=2)
                    for _ in range(2)]

    (plan_error, plan), (head_error, moved) = anyio.run(main)
    assert len(user.asked) == 2  # one question per call: never asked again on the new facts
    assert plan_error and (plan["state"], plan["reason_key"]) == ("rejected", "plan_changed"), plan
    assert plan["reason"].startswith(f"the batch plan of Initiative {SLUG} changed after native confirmation")
    assert head_error and (moved["state"], moved["reason_key"]) == ("rejected", "head_moved"), moved
    assert moved["reason"].startswith(f"HEAD of {repo} moved after native confirmation (from ")
    for refused in (plan, moved):
        assert refused["reason"].endswith("nothing was recorded")
        assert "start_unattended_batch again" in refused["recovery_action"]
    assert not (Path(repo) / ".imm" / "state" / "batches").exists() and store_events(repo) == 0
