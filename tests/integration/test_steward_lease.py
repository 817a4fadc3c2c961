"""One autopilot per Initiative (issue 12): the steward lease, on real processes, real git, both stores.

A second `lanes-es run` is refused at start naming the holder, or waits with --wait; two started
together never both provision; the holder SIGKILLed passes the lease on at once (its pid is gone
from this host), and one that dies elsewhere passes it on when it expires.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from lanes_es.adapters.steward_lease import LeaseHolder, StewardLeases, new_holder
from tests.integration.test_autopilot import (
    EXECUTOR, PROJECT, SLUG, TASKS, assert_completed_as_planned, executor_env, repo, deps_of,  # noqa: F401
)
from lanes_es.usecases.authorize import authorize
from lanes_es.usecases.confirmation import BatchOptions, prepare_confirmation

pytestmark = pytest.mark.coordinator_worktree

SCOPE = f"steward:{SLUG}"


def holder_as(host: str, pid: int) -> LeaseHolder:
    me = new_holder(SCOPE)
    return LeaseHolder(me.scope, me.token, pid, host, me.since, 0.0)


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


# ---------------------------------------------------------------- the lease itself


def test_a_held_lease_is_refused_naming_its_holder_until_it_expires_or_its_process_is_gone(store_url):
    leases = StewardLeases(store_url)
    elsewhere = holder_as("another-machine", 4242)
    assert leases.take(elsewhere, seconds=0.5) is None
    mine = new_holder(SCOPE)
    refused = leases.take(mine, seconds=30)
    assert refused is not None and (refused.pid, refused.host, refused.token) == (4242, "another-machine",
                                                                                 elsewhere.token)
    assert "pid 4242 on host another-machine" in refused.describe()
    time.sleep(0.6)  # the holder on the other machine stopped renewing: its lease runs out
    assert leases.take(mine, seconds=30) is None
    assert leases.renew(elsewhere, 30) is False  # it cannot renew what it lost
    leases.give_back(elsewhere)  # nor give it back
    assert leases.holder(SCOPE).token == mine.token

    gone = holder_as(socket.gethostname(), dead_pid())  # this machine's, its process gone: free at once
    assert leases.renew(mine, 0.0) is True
    leases.give_back(mine)
    assert leases.holder(SCOPE) is None
    assert leases.take(gone, seconds=3600) is None
    assert leases.take(mine, seconds=30) is None
    assert leases.holder(SCOPE).token == mine.token


# ---------------------------------------------------------------- autopilots as processes


def run_command(repo_root: str, lanes: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "lanes_es.cli.main", "--root", repo_root, "run", SLUG, "--max-parallel", "3",
            "--lanes-dir", str(lanes), "--executor", " ".join(EXECUTOR), "--yes", "--poll", "0.05", *extra]


def wait_for_a_holder(url: str, among: list[subprocess.Popen[bytes]]) -> LeaseHolder:
    deadline = time.monotonic() + 60  # a guard against a hung test, not a timing check
    leases = StewardLeases(url)
    while time.monotonic() < deadline:
        holder = leases.holder(SCOPE)
        if holder is not None and holder.pid in {process.pid for process in among}:
            return holder
        assert all(process.poll() is None for process in among), "an autopilot ended before it held the lease"
        time.sleep(0.02)
    raise AssertionError("no autopilot took the lease")


def admitted_once_each(url: str, root: str) -> None:
    (batch_id,) = deps_of(root).store.batch_ids()
    admitted = [event.task_id for event in deps_of(root).store.events(batch_id)
                if type(event).__name__ == "LaneAdmitted"]
    assert sorted(admitted) == sorted(TASKS)


def test_two_autopilots_started_together_one_steward_the_other_waits_a_third_is_refused(repo, tmp_path, executor_env,
                                                                                       store_url):
    lanes = tmp_path / "lanes"
    # In place: the one that waited finds the batch completed in the checkout, nothing to run (in the default
    # mode it would confirm a new batch from the user's HEAD and be told to land imm/six first).
    env = {**executor_env, "LANES_ES_STORE": store_url, "LANES_ES_COORDINATOR": "."}
    logs = [open(tmp_path / f"run-{n}.log", "w+") for n in range(2)]
    both = [subprocess.Popen(run_command(repo, lanes, "--wait", "300"), cwd=PROJECT, env=env, stdout=log,
                             stderr=subprocess.STDOUT) for log in logs]
    holder = wait_for_a_holder(store_url, both)
    third = subprocess.run(run_command(repo, lanes, "--json"), cwd=PROJECT, env=env, capture_output=True, text=True,
                           timeout=120)
    codes = [process.wait(timeout=300) for process in both]
    outputs = [log.seek(0) or log.read() for log in logs]
    assert codes == [0, 0], outputs

    assert third.returncode == 2, third.stdout + third.stderr
    (refusal,) = [json.loads(line) for line in third.stdout.splitlines()]
    assert refusal["kind"] == "steward" and refusal["reason"] == "steward_busy"
    assert refusal["holder"]["pid"] == holder.pid and refusal["holder"]["host"] == socket.gethostname()
    assert f"already has an autopilot: pid {holder.pid} on host {socket.gethostname()}" in refusal["text"]

    steward = [output for process, output in zip(both, outputs) if process.pid == holder.pid][0]
    waited = [output for process, output in zip(both, outputs) if process.pid != holder.pid][0]
    assert "executor: started for" in steward and "executor: started for" not in waited
    assert f"waiting up to 300s for the autopilot that holds Initiative {SLUG}: pid {holder.pid}" in waited
    # It came after the end and made nothing: it found nothing to run, or, when the store was not made yet as it
    # started (the lease, a row in the store, is then taken after the confirmation's append), it confirmed the
    # same yes first (recorded once) and found the batch completed.
    assert "steward: offering" not in waited, waited
    assert "nothing to run" in waited or "then land them" in waited, waited
    recorded = {authorization.batch_id for authorization in authorizations(repo)}
    said = [line.split()[1] for output in outputs for line in output.splitlines() if line.startswith("confirmed ")]
    assert said and set(said) <= recorded, (said, recorded)  # a run names the batch the log holds, not its own id
    assert_completed_as_planned(repo, lanes)
    admitted_once_each(store_url, repo)
    assert StewardLeases(store_url).holder(SCOPE) is None  # given back at the end


def test_the_holder_sigkilled_passes_the_lease_on_at_once(repo, tmp_path, executor_env, store_url):
    lanes = tmp_path / "lanes"
    env = {**executor_env, "LANES_ES_STORE": store_url}
    with open(tmp_path / "first.log", "w") as log:
        first = subprocess.Popen(run_command(repo, lanes), cwd=PROJECT, env=env, stdout=log, stderr=subprocess.STDOUT)
        holder = wait_for_a_holder(store_url, [first])
        deadline = time.monotonic() + 60
        while not list((lanes / ".executor-logs").glob("*.pid")) and time.monotonic() < deadline:
            time.sleep(0.02)  # killed with Executors working in its Lanes
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert StewardLeases(store_url).holder(SCOPE).pid == holder.pid  # the dead holder's row is still there

    again = subprocess.run(run_command(repo, lanes, "--json"), cwd=PROJECT, env=env, capture_output=True, text=True,
                           timeout=300)
    items = [json.loads(line) for line in again.stdout.splitlines()]
    assert again.returncode == 0, again.stdout + again.stderr
    assert not [item for item in items if item.get("action") in ("lease_waited", "refused")]
    assert items[-1]["kind"] == "summary" and items[-1]["batch_state"] == "completed"
    assert_completed_as_planned(repo, lanes)
    admitted_once_each(store_url, repo)
    assert StewardLeases(store_url).holder(SCOPE) is None


# ---------------------------------------------------------------- a busy tick


def test_a_tick_that_finds_the_batch_lock_held_is_tried_again_shortly(repo, tmp_path, executor_env, store_url):
    """Another tick (a person's `lanes-es tick`) holds the batch: the autopilot says busy once and ticks again."""
    import threading

    from lanes_es.steward.run import AutopilotOptions, run_autopilot

    deps = deps_of(repo)
    confirmation = prepare_confirmation(deps, SLUG, BatchOptions(max_parallel=3))
    authorize(deps, confirmation)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with deps_of(repo).store.batch_lock(confirmation.batch_id):
            held.set()
            release.wait(120)

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(60)
    items: list[dict] = []

    def out(line: str) -> None:
        items.append(json.loads(line))
        if items[-1].get("action") == "busy":
            release.set()  # the other tick ends once the autopilot has said it is waiting for it

    try:
        options = AutopilotOptions(batch=BatchOptions(max_parallel=3), lanes_dir=tmp_path / "lanes", executor=EXECUTOR,
                                   yes=True, poll=0.05, json_lines=True)
        code = run_autopilot(deps, SLUG, options, out=out)
    finally:
        release.set()
        holder.join()
    assert code == 0, items
    busy = [item for item in items if item.get("action") == "busy"]
    assert len(busy) == 1 and "held by" in busy[0]["reason"], busy  # said once for the wait, not once per try
    assert items.index(busy[0]) < min(n for n, item in enumerate(items) if item["kind"] == "event")  # before any tick
    assert items[-1]["batch_state"] == "completed"
    assert_completed_as_planned(repo, tmp_path / "lanes")


def authorizations(repo: str) -> list[Any]:
    from lanes_es.bootstrap import bootstrap

    deps = bootstrap(repo, read_only=True)
    try:
        return list(deps.store.initiative(SLUG).authorizations)
    finally:
        deps.store.close()

