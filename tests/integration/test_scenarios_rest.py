"""The scenarios of upstream's scenario list (tests/SCENARIOS.md) that no other test ported, on real repositories and
worktrees with the real engine, and through the entry points that stand where upstream's Hosts
stand (the CLI and the MCP server). tests/SCENARIOS.md maps every scenario to its test."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from lanes_es.adapters.kernel import ReferenceKernel
from lanes_es.ports import KernelError
from lanes_es.usecases.tick import STORE_CONDITION_NEXT
from lanes_es.tick import TickContext, lane_rejection_report
from lanes_es.tick_input import TickInput
from tests.engine import Engine, Task, initiative_markdown
from tests.engine_more import enroll, make_engine, state_bytes
from tests.gitfixtures import (
    all_refs, coordinator, current_branch, git_out, head, intent_json, make_repo, porcelain, run_git, write_file,
)
from lanes_es.usecases.load import initiative
from lanes_es.usecases.plan import plan
from lanes_es.usecases.tick import tick

SLUG = "initiative-slug"

pytestmark = [pytest.mark.usefixtures("store_url"), pytest.mark.coordinator_worktree]  # each test once on SQLite, once on PostgreSQL


def cli(*args: str) -> tuple[int, str, str]:
    """`lanes-es ARGS` in this process: (exit code, stdout, stderr)."""
    from lanes_es.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def release_tasks(report: dict[str, Any]) -> list[str]:
    return [h["task_id"] for h in report["handoffs"] if h.get("action") == "release"]


# ---------------------------------------------------------------- LANE-LCM-01, LANE-CMP-01


def test_lcm01_cmp01_two_dependent_children_complete_through_real_worktrees(tmp_path):
    engine = make_engine(tmp_path, {"task-a": Task(["a.txt"]), "task-b": Task(["b.txt"], blocked_by=["task-a"])})
    engine.authorize()
    report = engine.tick()
    base = report["handoffs"][0]["base_head"]
    lane_a = engine.provision("task-a", report)
    engine.tick(offers={"task-a": lane_a})
    assert engine.states() == ["enrolled", "pending"]
    engine.deliver("task-a", "a.txt", "a\n")
    # LANE-LCM-01: committed on the Lane branch, then integrated
    report = engine.tick()
    assert engine.states() == ["integrated", "pending"]
    [commit] = report["commits"]
    assert head(engine.root) == commit == engine.head()
    # batch head == Lane base: the integration fast-forwards to the lane commit itself
    assert git_out(engine.root, "rev-parse", "imm-lane/initiative-slug/task-a") == commit
    assert git_out(engine.root, "rev-parse", f"{commit}^") == base
    assert Path(engine.root, "a.txt").read_text() == "a\n"
    provisions = [h for h in report["handoffs"] if h.get("action") == "provision"]
    assert provisions == [{"role": "lane-steward", "action": "provision", "task_id": "task-b",
                           "lane_branch": "imm-lane/initiative-slug/task-b", "base_head": commit,
                           "executor_hosts": ["claude-code", "pi"]}]
    # LANE-CMP-01: task-b's Lane is cut from the new head and completes the batch
    lane_b = engine.provision("task-b", report)
    assert Path(lane_b, "a.txt").read_text() == "a\n"
    engine.tick(offers={"task-b": lane_b})
    engine.deliver("task-b", "b.txt", "b\n")
    report = engine.tick()
    assert (report["batch_state"], report["reason"]) == ("completed", "all enrollable children integrated")
    assert engine.states() == ["integrated", "integrated"] and len(report["commits"]) == 2
    assert engine.subjects(base) == ["imm(task-b): Deliver task-b", "imm(task-a): Deliver task-a"]
    assert json.loads(engine.report_file().read_text())["batch_state"] == "completed"
    assert engine.report_file() == Path(engine.root, ".imm/state/batches", f"{engine.batch.id}.report.json")


# ---------------------------------------------------------------- LANE-REL-11 (and REL-01/02/03 on real git)


class Parent:
    """upstream's scripted Parent: one Executor session per executor handoff, never two for one task."""

    def __init__(self) -> None:
        self.launches: dict[str, int] = {}
        self.live: set[str] = set()

    def supervise(self, report: dict[str, Any]) -> list[str]:
        launched = []
        for handoff in report["handoffs"]:
            task_id = handoff["task_id"]
            if handoff["role"] == "executor" and task_id not in self.live:
                self.live.add(task_id)
                self.launches[task_id] = self.launches.get(task_id, 0) + 1
                launched.append(task_id)
        return launched

    def exits(self, task_id: str) -> None:
        self.live.discard(task_id)


def test_rel11_a_full_supervision_walkthrough_ends_with_releases(tmp_path):
    engine = make_engine(tmp_path, {"task-a": Task(["a.txt"]), "task-b": Task(["b.txt"]),
                                    "task-c": Task(["c.txt"], blocked_by=["task-a"])})
    engine.authorize(max_parallel=2)
    parent = Parent()
    report = engine.tick()
    assert [(h["action"], h["task_id"]) for h in report["handoffs"]] == [("provision", "task-a"), ("provision", "task-b")]
    assert parent.supervise(report) == []  # it launches only on executor handoffs
    report = engine.tick(offers={t: engine.provision(t, report) for t in ("task-a", "task-b")})
    assert engine.states() == ["enrolled", "enrolled", "pending"]
    assert release_tasks(report) == []  # LANE-REL-01: nothing to release while only enrolled
    assert parent.supervise(report) == ["task-a", "task-b"]
    # LANE-OBS-02: task-a's session exits having done nothing; the same handoff comes back
    parent.exits("task-a")
    report = engine.tick()
    assert engine.states() == ["enrolled", "enrolled", "pending"] and report["commits"] == []
    assert parent.supervise(report) == ["task-a"]
    assert parent.launches == {"task-a": 2, "task-b": 1}
    # task-a delivers: integrated, task-c may start, task-a's Lane is offered for release
    engine.deliver("task-a", "a.txt", "a\n")
    parent.exits("task-a")
    report = engine.tick()
    assert engine.states() == ["integrated", "enrolled", "pending"]
    assert ("provision", "task-c") in [(h.get("action"), h["task_id"]) for h in report["handoffs"]]
    assert release_tasks(report) == ["task-a"]
    assert parent.supervise(report) == []  # task-b's session is live
    lane_a = engine.lane("task-a")
    assert Path(lane_a).is_dir() and git_out(engine.root, "rev-parse", "imm-lane/initiative-slug/task-a")
    first_commit = report["commits"][0]
    # LANE-REL-02: the steward removes the Lane; the child is recorded released, its facts kept
    engine.release("task-a")
    lane_c = engine.provision("task-c", report)
    assert Path(lane_c, "a.txt").is_file()
    report = engine.tick(offers={"task-c": lane_c})
    assert engine.states() == ["released", "enrolled", "enrolled"]
    child_a = report["children"][0]
    assert (child_a["commit"], child_a["lane"]["branch"]) == (first_commit, "imm-lane/initiative-slug/task-a")
    assert report["commits"] == [first_commit] and release_tasks(report) == []
    assert parent.supervise(report) == ["task-c"]
    # LANE-REL-03: both deliver before one tick; present Lanes stay integrated and the batch completes
    for task_id in ("task-b", "task-c"):
        engine.deliver(task_id, f"{task_id[-1]}.txt", f"{task_id}\n")
        parent.exits(task_id)
    report = engine.tick()
    assert report["batch_state"] == "completed"
    assert engine.states() == ["released", "integrated", "integrated"]
    assert len(report["commits"]) == 3 and release_tasks(report) == ["task-b", "task-c"]
    assert parent.supervise(report) == []
    assert sorted(engine.subjects(engine.batch.record["base_head"])) == [
        "imm(task-a): Deliver task-a", "imm(task-b): Deliver task-b", "imm(task-c): Deliver task-c"]
    assert Path(engine.lane("task-b")).is_dir() and engine.batch.batch_state == "completed"


# ---------------------------------------------------------------- LANE-REL-10, LANE-LIN-01


def integrated_and_frozen(tmp_path: Path) -> Engine:
    """task-a integrated with a clean Lane and its audit pair on the batch branch; task-b enrolled and frozen."""
    engine = make_engine(tmp_path, {"task-a": Task(["a.txt"]), "task-b": Task(["b.txt"])})
    engine.authorize(max_parallel=2)
    enroll(engine, "task-a", "task-b")
    engine.deliver("task-a", "a.txt", "a\n")
    engine.tick()
    engine.submit("task-b")
    assert engine.states() == ["integrated", "enrolled"]
    return engine


def rejection_of(engine: Engine, reason: str = "kernel store is busy") -> dict[str, Any]:
    """upstream's laneRejectionReport over the persisted record, called directly (the tick fails the batch
    on a broken lineage before it reaches the kernel, so a rejection is never built there)."""
    tick = TickInput(root=engine.root, initiative_slug=engine.slug,
                     authorization=initiative(engine.deps, engine.slug).current, now=engine.deps.now())
    runner = TickContext(tick=tick, ports=engine.deps.adapters.tick_ports(engine.root, engine.slug),
                      persist_port=lambda _: None, batch=engine.batch)
    return lane_rejection_report(runner, reason, "retry")


def test_rel10_a_store_condition_rejection_offers_only_safe_release_handoffs(tmp_path, monkeypatch):
    engine = integrated_and_frozen(tmp_path)
    recorded = state_bytes(engine)
    release_a = {"role": "lane-steward", "action": "release", "task_id": "task-a",
                 "lane_branch": "imm-lane/initiative-slug/task-a"}

    def busy(self: Any, lane_path: str, task_id: str) -> Any:
        raise KernelError("kernel store is busy")

    monkeypatch.setattr(ReferenceKernel, "advance_task", busy)
    result = tick(engine.deps, engine.slug)
    report = result.report
    assert (report["batch_state"], result.written) == ("rejected", False)
    assert report["handoffs"] == [release_a]  # no provision, no executor: nothing is granted
    assert "release handoff" in report["next_action"]
    assert report["next_action"] == f"{STORE_CONDITION_NEXT}. Check each release handoff with the Lane Steward."
    assert state_bytes(engine) == recorded and Path(engine.lane("task-a")).is_dir()

    # a dirty Lane is not safe to release
    scratch = write_file(engine.lane("task-a"), "scratch.txt", "scratch\n")
    assert tick(engine.deps, engine.slug).report["handoffs"] == []
    os.unlink(scratch)

    # LANE-LIN-01: a coordinator reset behind the recorded commits breaks the lineage: nothing to release
    integrated = engine.head()
    assert rejection_of(engine)["handoffs"] == [release_a]  # the control, with the lineage whole
    run_git(engine.root, "reset", "-q", "--hard", engine.batch.record["base_head"])
    rejected = rejection_of(engine)
    assert (rejected["batch_state"], rejected["handoffs"]) == ("rejected", [])
    assert state_bytes(engine) == recorded
    run_git(engine.root, "reset", "-q", "--hard", integrated)
    assert rejection_of(engine)["handoffs"] == [release_a]

    # a Lane that holds another task's claim is not safe to release
    claim = Path(engine.lane("task-a"), ".imm/state/kernel/claim.json")
    claim.parent.mkdir(parents=True, exist_ok=True)
    claim.write_text(json.dumps({"task_id": "foreign-task", "run_id": "run-x", "batch_id": "other",
                                 "claimed_at": "2026-01-01T00:00:00.000Z"}))
    assert porcelain(engine.lane("task-a")) == ""  # the store is ignored: the Lane is still clean
    assert tick(engine.deps, engine.slug).report["handoffs"] == []
    assert state_bytes(engine) == recorded


# ---------------------------------------------------------------- LANE-CMP-07


def test_cmp07_integrated_and_released_children_plan_as_already_settled(tmp_path):
    engine = make_engine(tmp_path, {"task-a": Task(["a.txt"]), "task-b": Task(["b.txt"], blocked_by=["task-a"])})
    engine.authorize()
    enroll(engine, "task-a")
    engine.deliver("task-a", "a.txt", "a\n")
    engine.tick()
    assert engine.states() == ["integrated", "pending"]

    def statuses() -> list[tuple[str, str]]:
        return [(child["task_id"], child["status"]) for child in plan(engine.deps, engine.slug)["children"]]

    assert statuses() == [("task-a", "already_settled"), ("task-b", "enrollable")]
    engine.release("task-a")
    engine.tick()
    assert engine.states() == ["released", "pending"]
    assert statuses() == [("task-a", "already_settled"), ("task-b", "enrollable")]


# ---------------------------------------------------------------- LANE-GRP-07, LANE-GRP-08


SHARED_SPEC = "docs/specs/user-acceptance-scenarios.spec.md"


def test_grp07_the_read_only_plan_command_reports_the_shared_scope_and_the_serial_order(tmp_path):
    tasks = {"s2": Task([SHARED_SPEC, "s2.txt"]), "s3": Task([SHARED_SPEC, "s3.txt"])}
    root = make_repo(tmp_path / "repo", intents={t: intent_json(t, spec.scope) for t, spec in tasks.items()},
                     files={"docs/initiatives/overlap.md": initiative_markdown(tasks)})
    refs, before = all_refs(root), head(root)
    code, out, _ = cli("--root", root, "plan", "overlap", "--json")
    assert code == 0
    plan = json.loads(out)
    assert plan["scope_conflicts"] == [{"task_id": "s3", "overlaps_with": ["s2"]}]
    assert plan["parallel_groups"] == [["s2"], ["s3"]]
    code, out, _ = cli("--root", root, "plan", "overlap")
    assert code == 0 and "serialized: s3 overlaps s2" in out
    # read-only: no ref, no HEAD, no file in the checkout changed
    assert (all_refs(root), head(root), porcelain(root)) == (refs, before, "")
    assert not Path(root, ".imm").exists() and current_branch(root) == "main"


def test_grp07_the_intent_overlap_command_emits_upstreams_read_only_report(tmp_path):
    """Ports LANE-GRP-07 as upstream states it: `intent overlap <p1> <p2> --json`, in a subprocess,
    prints assurance_kernel/intent_scope_overlap/v1 whose first entry pair is the shared spec path;
    it reads the two files and writes nothing."""
    import subprocess
    import sys

    tasks = {"s2": Task([SHARED_SPEC, "s2.txt"]), "s3": Task([SHARED_SPEC, "s3.txt"])}
    root = make_repo(tmp_path / "repo", intents={t: intent_json(t, spec.scope) for t, spec in tasks.items()},
                     files={"docs/initiatives/overlap.md": initiative_markdown(tasks)})
    paths = [str(Path(root, "docs/plans", f"{task}.intent.json")) for task in tasks]
    before = (all_refs(root), head(root), porcelain(root))
    run = subprocess.run([sys.executable, "-m", "lanes_es.cli.main", "intent", "overlap", *paths, "--json"],
                         capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2])
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["contract"] == "assurance_kernel/intent_scope_overlap/v1"
    assert report["overlaps"][0]["entries"][0][0] == SHARED_SPEC
    assert report["overlaps"][0]["entries"] == [[SHARED_SPEC, SHARED_SPEC]]
    assert report["parallel_groups"] == [["s2"], ["s3"]]
    assert (all_refs(root), head(root), porcelain(root)) == before
    code, out, err = cli("intent", "overlap", paths[0], str(tmp_path / "missing.intent.json"))
    assert code == 2 and out == "" and "missing.intent.json: not a regular file" in err


def test_grp08_the_confirmation_facts_carry_the_lane_mode(tmp_path):
    engine = make_engine(tmp_path, {"task-a": Task(["a.txt"]), "task-b": Task(["b.txt"]),
                                    "task-c": Task(["a.txt", "c.txt"])})
    code, out, _ = cli("--root", engine.root, "authorize", engine.slug, "--max-parallel", "1", "--yes", "--json")
    assert code == 0
    facts = json.loads(out)
    assert facts["lane_mode"] == {"max_parallel": 1, "parallel_groups": [["task-a", "task-b"], ["task-c"]],
                                  "serialized": [{"task_id": "task-c", "overlaps_with": ["task-a"]}],
                                  "offer_revision_delegation": True, "delegate_revisions": False}
    assert initiative(engine.deps, engine.slug).current.max_parallel == 1


# ---------------------------------------------------------------- LANE-DEL-02


@pytest.mark.parametrize("flags, granted", [((), False), (("--delegate-revisions",), True)], ids=["confirm", "delegate"])
def test_del02_delegating_is_its_own_choice_beside_the_confirmation(tmp_path, flags, granted):
    engine = make_engine(tmp_path, {"task-a": Task(["a.txt"])})
    code, out, _ = cli("--root", engine.root, "authorize", engine.slug, "--yes", "--json", *flags)
    assert code == 0 and json.loads(out)["lane_mode"]["delegate_revisions"] is granted
    authorization = initiative(engine.deps, engine.slug).current
    assert authorization.delegate_revisions is granted
    engine.tick()
    grant = engine.batch.record.get("revision_delegation")
    assert grant == ({"confirmation_time": authorization.confirmation_time} if granted else None)


# ---------------------------------------------------------------- LANE-TRK-04


def test_trk04_a_settlement_inside_the_lane_writes_no_tracker_state(tmp_path, monkeypatch):
    from tests.integration.test_tracker import Tracker

    tracker = Tracker(tmp_path, monkeypatch)
    engine = make_engine(tmp_path, {"task-a": Task(["a.txt"])})
    engine.authorize()
    enroll(engine, "task-a")
    lane = engine.lane("task-a")
    write_file(lane, "a.txt", "a\n")
    for command in ("check", "submit", "status"):  # the Executor's own commands, run in the Lane
        assert cli("--root", lane, "task", command)[0] == 0
    assert tracker.calls() == []
    report = engine.tick()  # QA and the kernel's settlement in the Lane, then the integration
    assert report["batch_state"] == "completed" and report["children"][0]["tracker_closed"] is True
    assert [call["root"] for call in tracker.calls()] == [engine.root]  # the coordinator, never the Lane


# ---------------------------------------------------------------- LANE-SER-01


def test_ser01_preflight_refusals_leave_no_branch_and_no_state(tmp_path):
    from lanes_es.adapters.batch_git import GitBatch

    for case in ("modified", "untracked_hidden"):
        root = make_repo(tmp_path / case)
        base = head(root)
        if case == "modified":
            write_file(root, "base.txt", "edited\n")
        else:
            run_git(root, "config", "status.showUntrackedFiles", "no")
            write_file(root, "stray.txt", "stray\n")
        result = GitBatch().preflight(root, SLUG, base)
        assert (result.ok, result.reason) == (False, "dirty_working_tree"), case
        assert current_branch(root) == "main" and head(root) == base
        assert git_out(root, "branch", "--list", f"imm/{SLUG}") == ""
        assert not Path(root, ".imm/state/batches").exists()


def test_ser01_a_failing_post_checkout_hook_is_bypassed(tmp_path):
    from lanes_es.adapters.batch_git import GitBatch

    root = make_repo(tmp_path / "repo")
    base = head(root)
    hook = Path(root, ".git/hooks/post-checkout")
    hook.write_text("#!/bin/sh\necho hooked > hooked.txt\nexit 1\n")
    hook.chmod(0o755)
    result = GitBatch().preflight(root, SLUG, base)
    assert (result.ok, result.branch) == (True, f"imm/{SLUG}")
    assert current_branch(root) == f"imm/{SLUG}" and head(root) == base
    assert not Path(root, "hooked.txt").exists()


# ---------------------------------------------------------------- LANE-LIN-05


@pytest.mark.parametrize("expected", ["0" * 40, "HEAD"], ids=["zeros", "symbolic"])
def test_lin05_the_kernel_refuses_an_enrollment_on_a_wrong_head_with_nothing_consumed(tmp_path, expected):
    from tests.integration.test_kernel import World, store_files

    world = World(tmp_path, {"task-a": intent_json("task-a", ["a.txt"])})
    lane = world.lane("task-a")
    with pytest.raises(KernelError) as refused:
        world.kernel.enroll_task(lane, "task-a", world.enrollment(expected))
    assert str(refused.value) == (f"batch_head_lineage_broken: current HEAD {world.base} does not match "
                                  f"expected_head {expected}")
    assert not world.capability.is_child_consumed("task-a")
    assert store_files(lane) == [] and world.kernel.active_claim_task_id(lane) is None


# ---------------------------------------------------------------- LANE-LOC-05, LANE-LOC-10


def test_loc05_a_missing_or_symlinked_carrier(tmp_path):
    from lanes_es.adapters.initiative_reader import has_local_initiative, read_local_initiative
    from lanes_es.ports import PortError

    root = str(tmp_path)
    assert has_local_initiative(root, "local-batch") is False
    with pytest.raises(PortError, match="does not exist"):
        read_local_initiative(root, "local-batch")
    target = write_file(tmp_path / "elsewhere", "local-batch.md", "# Goal\n## S1: One\nTasks:\n- local-alpha\n")
    Path(root, "docs/initiatives").mkdir(parents=True)
    os.symlink(target, Path(root, "docs/initiatives/local-batch.md"))
    for read in (has_local_initiative, read_local_initiative):
        with pytest.raises(PortError, match="must be a regular file"):
            read(root, "local-batch")


def test_loc10_without_a_carrier_the_plan_is_refused(tmp_path):
    """lanes-es has no GitHub reader to fall back to: the Local carrier is the only one."""
    root = make_repo(tmp_path / "repo")
    code, _, err = cli("--root", root, "plan", "local-batch")
    assert code == 2
    assert "plan_projection_failed" in err and "docs/initiatives/local-batch.md does not exist" in err
    code, _, err = cli("--root", root, "plan", "../escape")
    assert code == 2 and "initiative_slug '../escape' is invalid" in err


# ---------------------------------------------------------------- LANE-HOST-01, LANE-INP-07 (CLI and MCP)


PARITY_SLUG = "parity"
PARITY_TASKS = {"task-a": Task(["a.txt"]), "task-b": Task(["b.txt"]), "task-c": Task(["c.txt"], blocked_by=["task-a"])}
UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


def twin_repo(directory: Path) -> str:
    """The same fixture for each entry point: its own repository, its Lanes beside it."""
    from tests.engine_more import PASSES

    intents = {task: intent_json(task, spec.scope, verification=PASSES) for task, spec in PARITY_TASKS.items()}
    return make_repo(directory / "repo", intents=intents,
                     files={f"docs/initiatives/{PARITY_SLUG}.md": initiative_markdown(PARITY_TASKS)})


def provision_all(root: str, report: dict[str, Any]) -> list[dict[str, str]]:
    """The steward: a worktree for each provision handoff, in <repo>/../lanes/<task>."""
    offers = []
    for handoff in report["handoffs"]:
        if handoff.get("action") == "provision":
            lane = Path(root).parent / "lanes" / handoff["task_id"]
            run_git(root, "worktree", "add", "-q", "-b", handoff["lane_branch"], str(lane), handoff["base_head"])
            offers.append({"task_id": handoff["task_id"], "path": os.path.realpath(lane)})
    return offers


def normalized(report: dict[str, Any], directory: Path) -> Any:
    """Heads, batch ids, run ids, times and the fixture's own directory replaced by placeholders."""
    text = json.dumps(report, sort_keys=True).replace(os.path.realpath(directory), "<dir>")
    text = re.sub(rf"batch-{PARITY_SLUG}-{UUID}", "<batch>", text)
    text = re.sub(UUID, "<uuid>", text)
    text = re.sub(r"\b[0-9a-f]{40}\b", "<head>", text)
    text = re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", "<time>", text)
    return json.loads(text)


def cli_reports(directory: Path, max_parallel: int, store: str) -> list[dict[str, Any]]:
    """`lanes-es authorize --yes`, then `tick --json` three times: start, resume with nothing, offer the Lanes."""
    root = twin_repo(directory)
    assert cli("--root", root, "--store", store, "authorize", PARITY_SLUG, "--max-parallel", str(max_parallel), "--yes")[0] == 0
    reports = []
    for _ in range(2):
        code, out, _ = cli("--root", root, "--store", store, "tick", PARITY_SLUG, "--json")
        assert code == 0
        reports.append(json.loads(out))
    offers = [f"--offer={offer['task_id']}={offer['path']}" for offer in provision_all(root, reports[-1])]
    code, out, _ = cli("--root", root, "--store", store, "tick", PARITY_SLUG, "--json", *offers)
    assert code == 0
    return reports + [json.loads(out)]


def mcp_payloads(directory: Path, tmp_path: Path, max_parallel: int) -> list[dict[str, Any]]:
    """start_unattended_batch three times: with max_parallel (the user accepts), with lane_offers [] alone,
    with the Lanes offered."""
    import anyio

    from tests.integration.test_mcp_server import User, call, host

    root = twin_repo(directory)

    async def main() -> list[dict[str, Any]]:
        async with host(root, tmp_path, User()) as client:
            payloads = [(await call(client, "start_unattended_batch", initiative_slug=PARITY_SLUG,
                                    max_parallel=max_parallel))[1]]
            payloads.append((await call(client, "start_unattended_batch", initiative_slug=PARITY_SLUG,
                                        lane_offers=[]))[1])
            offers = provision_all(root, payloads[-1]["report"])
            payloads.append((await call(client, "start_unattended_batch", initiative_slug=PARITY_SLUG,
                                        lane_offers=offers))[1])
            return payloads

    return anyio.run(main)


@pytest.mark.parametrize("max_parallel", [1, 2])
def test_host01_inp07_the_cli_and_the_mcp_server_give_the_same_lane_report(tmp_path, max_parallel, another_store):
    by_cli = cli_reports(tmp_path / "cli", max_parallel, another_store())  # the twins authorize the same slug
    payloads = mcp_payloads(tmp_path / "mcp", tmp_path, max_parallel)
    assert [payload["state"] for payload in payloads] == ["started"] * 3
    by_mcp = [payload["report"] for payload in payloads]
    first = by_mcp[0]
    assert first["max_parallel"] == max_parallel and "handoff" not in first
    assert {k: first["handoffs"][0][k] for k in ("role", "action")} == {"role": "lane-steward", "action": "provision"}
    assert len(first["handoffs"]) == max_parallel
    # LANE-INP-07: lane_offers alone (the CLI: no --max-parallel) resumes the recorded lane batch
    assert by_mcp[1]["max_parallel"] == by_cli[1]["max_parallel"] == max_parallel
    assert [child["state"] for child in by_mcp[2]["children"]] == ["enrolled"] * max_parallel + ["pending"] * (3 - max_parallel)
    for cli_report, mcp_report in zip(by_cli, by_mcp):
        assert list(cli_report) == list(mcp_report)  # the same fields, in upstream's order
        assert normalized(cli_report, tmp_path / "cli") == normalized(mcp_report, tmp_path / "mcp")
        assert normalized(cli_report["handoffs"], tmp_path / "cli") == normalized(mcp_report["handoffs"], tmp_path / "mcp")


# ---------------------------------------------------------------- LANE-DISP-06 (the MCP retirement gate)


def test_disp06_declining_or_cancelling_a_retirement_writes_nothing(tmp_path):
    import anyio

    from tests.integration.test_mcp_server import User, call, host

    class ScriptedUser(User):
        """Accepts the batch, then answers each retirement gate as scripted."""

        def __init__(self, *answers: str) -> None:
            super().__init__()
            self.answers = list(answers)

        async def __call__(self, context: Any, params: Any) -> Any:
            self.action = self.answers.pop(0)
            return await super().__call__(context, params)

    root = twin_repo(tmp_path)
    user = ScriptedUser("accept", "decline", "cancel")
    batches = coordinator(root, PARITY_SLUG) / ".imm" / "state" / "batches"  # the batch runs in its own worktree

    async def main() -> tuple[dict[str, Any], list[tuple[bool, dict[str, Any]]], dict[str, bytes]]:
        async with host(root, tmp_path, user, mode="legacy") as client:
            started = (await call(client, "start_unattended_batch", initiative_slug=PARITY_SLUG, max_parallel=1))[1]
            before = {p.name: p.read_bytes() for p in batches.iterdir()}
            answers = [await call(client, "retire_stale_batch", initiative_slug=PARITY_SLUG) for _ in range(2)]
            status = (await call(client, "batch_status", initiative_slug=PARITY_SLUG))[1]
            assert status["batch_state"] == "running"
            return started, answers, before

    started, answers, before = anyio.run(main)
    assert started["state"] == "started" and len(user.asked) == 3
    assert [(is_error, payload["state"], payload["reason_key"]) for is_error, payload in answers] == [
        (True, "rejected", "confirmation_declined"), (True, "cancelled", "confirmation_cancelled")]
    assert {p.name: p.read_bytes() for p in batches.iterdir()} == before  # no record change, no report
    assert not any(name.endswith(".report.json") for name in before)
