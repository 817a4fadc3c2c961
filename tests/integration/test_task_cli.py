"""`lanes-es task ...` in real Lanes: Lane identification, the Executor's round, refusals and exit codes."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest

from tests.gitfixtures import intent_json, requires_file, run_git, write_file
from tests.integration.test_kernel import World
from lanes_es.cli import task as task_cli

# Every test here goes through the store: run each on SQLite and on PostgreSQL (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("store_url")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cli(cwd: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m lanes_es.cli.main task ...` run from `cwd`, as an Executor would in its Lane."""
    env = {**os.environ, "PYTHONPATH": REPO}
    return subprocess.run([sys.executable, "-m", "lanes_es.cli.main", "task", *args], cwd=cwd, env=env, text=True,
                          capture_output=True)


def namespace(root: str, **values) -> argparse.Namespace:
    return argparse.Namespace(root=root, **values)


@pytest.fixture
def world(tmp_path):
    return World(tmp_path, {"task-a": intent_json("task-a", ["a.txt"], verification=requires_file("a.txt")),
                            "task-m": intent_json("task-m", ["m.txt"], risk="material")})


def test_outside_a_lane_the_commands_refuse_and_say_what_to_do(world, tmp_path):
    on_main = cli(world.root, "status")
    assert on_main.returncode == 2
    assert "not a Lane branch imm-lane/<slug>/<task>" in on_main.stderr
    outside = tmp_path / "plain"
    outside.mkdir()
    not_git = cli(str(outside), "submit")
    assert not_git.returncode == 2
    assert "is not inside a git worktree" in not_git.stderr


def test_a_lane_not_yet_enrolled_is_refused_with_the_next_step(world):
    lane = world.lane("task-a")
    result = cli(lane, "status")
    assert result.returncode == 2
    assert "task task-a is not enrolled" in result.stderr


def test_the_executor_round_check_submit_status(world):
    lane = world.enroll("task-a")
    failing = cli(lane, "check")
    assert failing.returncode == 1  # a finding, as verify's
    assert "task-a:A1: python3 exited with code 1" in failing.stdout

    write_file(lane, "a.txt", "a\n")
    passing = cli(lane, "check", "--json")
    assert passing.returncode == 0
    assert json.loads(passing.stdout)["decision"] == "pass"
    assert world.kernel.project_task(lane, "task-a").record_revision == 1  # check changes nothing

    submitted = cli(lane, "submit")
    assert submitted.returncode == 0
    assert "submitted task-a" in submitted.stdout
    again = cli(lane, "submit")
    assert again.returncode == 2
    assert "already submitted" in again.stderr

    status = json.loads(cli(lane, "status", "--json").stdout)
    assert (status["task_id"], status["lifecycle"], status["artifact_state"], status["lane_path"]) == \
        ("task-a", "active", "frozen", lane)
    text = cli(os.path.join(lane, "docs"), "status").stdout  # from a subdirectory of the Lane too
    assert "next: submitted: the coordinator runs QA on its next tick" in text


def test_status_shows_the_findings_of_a_failed_qa(world):
    lane = world.enroll("task-a")
    world.kernel.submit(lane)
    world.kernel.advance_task(lane, "task-a")
    text = cli(lane, "status").stdout
    assert "latest QA findings:" in text
    assert "task-a:A1: python3 exited with code 1" in text


def test_review_needs_an_open_reservation_then_records_the_verdict(world):
    lane = world.enroll("task-m")
    assert task_cli.run_review(namespace(lane, approve=True, reject=None)) == 2
    world.kernel.submit(lane)
    assert world.kernel.advance_task(lane, "task-m").state == "review_ready"

    assert task_cli.run_review(namespace(lane, approve=False, reject="split the change")) == 0

    status = world.kernel.status(lane)
    assert (status.review.state, status.review.text) == ("rejected", "split the change")
    assert world.kernel.advance_task(lane, "task-m").operation == "review"


def test_review_takes_exactly_one_verdict(world):
    lane = world.enroll("task-m")
    assert cli(lane, "review").returncode == 2
    assert cli(lane, "review", "--approve", "--reject", "x").returncode == 2


def test_stop_records_the_reason_and_the_task_is_stopped(world):
    lane = world.enroll("task-a")
    result = cli(lane, "stop", "--reason", "the intent cannot be met")
    assert result.returncode == 0
    assert world.kernel.project_task(lane, "task-a").lifecycle == "stopped"
    assert "the intent cannot be met" in world.kernel.advance_task(lane, "task-a").reason
    assert task_cli.run_stop(namespace(lane, reason="again")) == 2


def test_a_detached_lane_is_not_identified(world):
    lane = world.lane("task-a")
    run_git(lane, "checkout", "-q", "--detach")
    with pytest.raises(task_cli.NotInLane, match="a detached HEAD"):
        task_cli.locate_lane(lane)


def test_locate_lane_reads_the_task_from_the_lane_branch(world):
    lane = world.lane("task-a")
    assert task_cli.locate_lane(os.path.join(lane, "docs")) == (lane, "task-a")
