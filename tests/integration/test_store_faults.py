"""Faults under a coordinator, through the real command line: each ends as an outcome with the way on.

- the PostgreSQL server ends the command's connections (`pg_terminate_backend`) in the middle of a tick:
  the connections are made again and the tick goes on; so are the autopilot's, ended while an Executor works;
- the server goes down in the middle of a tick: exit 2 naming the server as an outage (never as a
  damaged log), and the next tick, once it is back, goes on from the log;
- the server goes down under the autopilot: it says so, waits for it, and goes on when it is back;
- another git command leaves a worktree's `commondir` empty while the autopilot lists the worktrees:
  listed again, and when it stays so, the Lane is kept with the reason (never exit 70).

The PostgreSQL faults run on a cluster this module starts on a port of its own (tests/pg_cluster.py),
never on the machine's shared server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

from lanes_es.exit_codes import EXIT_OK, EXIT_REFUSED
from tests.engine import Task, initiative_markdown
from tests.gitfixtures import descriptor, intent_json, make_repo, requires_file, run_git, write_file
from tests.pg_cluster import Cluster, own_cluster

pytestmark = pytest.mark.coordinator_worktree

PROJECT = str(Path(__file__).resolve().parents[2])
SLUG = "faults"
DAMAGE_WORDS = "missing, reordered or damaged"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with own_cluster() as made:
        yield made


@pytest.fixture
def store(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh database of the module's own cluster, as every command's store (LANES_ES_STORE)."""
    if not cluster.running():
        cluster.start()
    url = cluster.new_database()
    monkeypatch.setenv("LANES_ES_STORE", url)
    return url


def lanes(cwd: Path | str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lanes_es.cli.main", *args], cwd=cwd, text=True,
                          stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": PROJECT})


def one_task_repo(root: Path, check: str) -> str:
    """One task, `task-a` (scope a.txt): its acceptance runs `check`, then requires a.txt."""
    intent = intent_json("task-a", ["a.txt"], acceptance=[
        {"id": "A1", "assertion": "the fault happened", "verification": check},
        {"id": "A2", "assertion": "a.txt is delivered", "verification": requires_file("a.txt")}])
    return make_repo(root, intents={"task-a": intent},
                     files={f"docs/initiatives/{SLUG}.md": initiative_markdown({"task-a": Task(["a.txt"])})})


def submitted_lane(repo: str, lanes_dir: Path) -> None:
    """authorize, the provision handoff, the Lane offered and enrolled, the delivery submitted."""
    assert lanes(repo, "authorize", SLUG, "--yes", "--max-parallel", "1").returncode == EXIT_OK
    handoff = json.loads(lanes(repo, "tick", SLUG, "--json").stdout)["handoffs"][0]
    lane = lanes_dir / "task-a"
    run_git(repo, "worktree", "add", "-q", "-b", handoff["lane_branch"], str(lane), handoff["base_head"])
    offered = lanes(repo, "tick", SLUG, "--offer", f"task-a={os.path.realpath(lane)}")
    assert offered.returncode == EXIT_OK, offered.stderr
    write_file(lane, "a.txt", "a\n")
    assert lanes(lane, "task", "submit").returncode == EXIT_OK


def one_line(result: subprocess.CompletedProcess[str], code: int) -> str:
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    line = result.stderr.strip()
    assert "\n" not in line and "Traceback" not in line and "internal error" not in line, line
    return line


def test_connections_the_server_ends_in_the_middle_of_a_tick_are_made_again(store, cluster, tmp_path):
    """The check ends every other backend of the store's database while the tick holds its pooled connection
    and its batch lock's session (as `pg_terminate_backend` by an operator or a pooler does)."""
    database = store.rsplit("/", 1)[1]
    terminate = descriptor(["-qAt", "-h", "127.0.0.1", "-p", str(cluster.port), "-U", "postgres", "-d", database,
                            "-c", "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                  "WHERE datname = current_database() AND pid <> pg_backend_pid()"],
                           executable="psql")
    repo = one_task_repo(tmp_path / "repo", terminate)
    submitted_lane(repo, tmp_path / "lanes")

    ticked = lanes(repo, "tick", SLUG, "--json")

    assert ticked.returncode == EXIT_OK, ticked.stderr
    report = json.loads(ticked.stdout)
    assert report["batch_state"] == "completed", report
    assert lanes(repo, "rebuild", report["batch_id"], "--check").returncode == EXIT_OK


def test_the_server_down_in_the_middle_of_a_tick_is_an_outage_and_the_next_tick_goes_on(store, cluster, tmp_path):
    # once: a fast shutdown (SIGINT, as `pg_ctl -m fast`), then up to 30 s for the server to be gone
    once = tmp_path / "stopped"
    stop_server = descriptor(["-c", f"import os, signal, time, pathlib; once = pathlib.Path({str(once)!r}); "
                                    f"pid = 0 if once.exists() else int(open({str(cluster.data / 'postmaster.pid')!r})"
                                    ".readline()); once.touch(); pid and os.kill(pid, signal.SIGINT); "
                                    "[time.sleep(0.05) for _ in range(600) if pid and os.path.exists(f'/proc/{pid}')]"])
    repo = one_task_repo(tmp_path / "repo", stop_server)
    submitted_lane(repo, tmp_path / "lanes")

    cut = lanes(repo, "tick", SLUG)
    while_down = lanes(repo, "status", SLUG)

    line = one_line(cut, EXIT_REFUSED)
    assert f"does not answer at 127.0.0.1:{cluster.port}" in line and "outage" in line, line
    assert "run the command again once the server is back" in line and DAMAGE_WORDS not in line, line
    assert f"no PostgreSQL listens on 127.0.0.1:{cluster.port}" in one_line(while_down, EXIT_REFUSED)
    cluster.start()
    ticked = lanes(repo, "tick", SLUG, "--json")
    assert ticked.returncode == EXIT_OK, ticked.stderr
    report = json.loads(ticked.stdout)
    assert report["batch_state"] == "completed", report
    assert lanes(repo, "verify", report["batch_id"]).returncode == EXIT_OK


EXECUTOR = """\
import os, pathlib, subprocess, sys, time
lane, task = os.environ["LANES_ES_LANE_PATH"], os.environ["LANES_ES_TASK_ID"]
pathlib.Path(lane, "a.txt").write_text("a\\n")
subprocess.run([sys.executable, "-m", "lanes_es.cli.main", "task", "submit"], cwd=lane, check=True)
signal = pathlib.Path(sys.argv[1])
signal.write_text("submitted")  # the test stops the store's server now
while not signal.with_suffix(".down").exists():
    time.sleep(0.05)
"""


def test_the_autopilot_rides_out_a_store_outage_and_goes_on_when_it_is_back(store, cluster, tmp_path):
    repo = one_task_repo(tmp_path / "repo", requires_file("a.txt"))
    script, signal = tmp_path / "executor.py", tmp_path / "submitted"
    script.write_text(EXECUTOR)

    def operator() -> None:  # stops the server once the Executor submitted, starts it again 3 s later
        while not signal.exists():
            time.sleep(0.05)
        cluster.stop()
        signal.with_suffix(".down").write_text("down")
        time.sleep(3)
        cluster.start()

    restarts = threading.Thread(target=operator, daemon=True)
    restarts.start()
    ran = lanes(repo, "run", SLUG, "--max-parallel", "1", "--lanes-dir", str(tmp_path / "lanes"), "--yes",
                "--executor", f"{sys.executable} {script} {signal}", timeout=300)
    restarts.join(timeout=60)

    assert ran.returncode == EXIT_OK, (ran.stdout, ran.stderr)
    told = ran.stdout
    assert f"store outage: the event store {store} does not answer" in told, told
    assert "waiting for it" in told and "answers again after" in told, told
    assert told.index("store outage") < told.index("answers again") < told.rindex("completed")
    assert ran.stderr == "", ran.stderr


TERMINATING_EXECUTOR = """\
import os, pathlib, subprocess, sys
lane, (port, database) = os.environ["LANES_ES_LANE_PATH"], sys.argv[1:3]
# the server ends every session of the store's database, the autopilot's idle pooled connections among them
subprocess.run(["psql", "-qAt", "-h", "127.0.0.1", "-p", port, "-U", "postgres", "-d", database, "-c",
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"], check=True)
pathlib.Path(lane, "a.txt").write_text("a\\n")
subprocess.run([sys.executable, "-m", "lanes_es.cli.main", "task", "submit"], cwd=lane, check=True)
"""


def test_the_autopilot_makes_again_the_connections_the_server_ended_while_an_executor_worked(store, cluster,
                                                                                            tmp_path):
    """The connections a long-lived coordinator keeps between ticks, ended by the server (`pg_terminate_backend`)
    while the Executor works: the tick its exit wakes makes them again (on the issue's main: internal error,
    AdminShutdown)."""
    repo = one_task_repo(tmp_path / "repo", requires_file("a.txt"))
    script = tmp_path / "executor.py"
    script.write_text(TERMINATING_EXECUTOR)

    ran = lanes(repo, "run", SLUG, "--max-parallel", "1", "--lanes-dir", str(tmp_path / "lanes"), "--yes",
                "--executor", f"{sys.executable} {script} {cluster.port} {store.rsplit('/', 1)[1]}", timeout=300)

    assert ran.returncode == EXIT_OK, (ran.stdout, ran.stderr)
    assert "completed" in ran.stdout and "store outage" not in ran.stdout, ran.stdout
    assert ran.stderr == "", ran.stderr


HALF_MADE_EXECUTOR = """\
import os, pathlib, subprocess, sys
lane, root = os.environ["LANES_ES_LANE_PATH"], os.environ["LANES_ES_ROOT"]
pathlib.Path(lane, "a.txt").write_text("a\\n")
subprocess.run([sys.executable, "-m", "lanes_es.cli.main", "task", "submit"], cwd=lane, check=True)
# another coordinator's `git worktree add` caught half-way: its entry is there, its commondir still empty
common = subprocess.run(["git", "-C", root, "rev-parse", "--path-format=absolute", "--git-common-dir"],
                        check=True, capture_output=True, text=True).stdout.strip()  # the coordinator may be a worktree
entry = pathlib.Path(common, "worktrees", "half-made")
entry.mkdir(parents=True)
(entry / "gitdir").write_text(os.path.join(os.path.dirname(lane), "half-made", ".git") + "\\n")
(entry / "commondir").write_text("")
"""


def half_made_run(tmp_path: Path) -> tuple[str, list[str]]:
    repo = one_task_repo(tmp_path / "repo", requires_file("a.txt"))
    script = tmp_path / "executor.py"
    script.write_text(HALF_MADE_EXECUTOR)
    return repo, ["--root", repo, "run", SLUG, "--max-parallel", "1", "--lanes-dir", str(tmp_path / "lanes"), "--yes",
                  "--executor", f"{sys.executable} {script}"]


def test_a_worktree_list_that_stays_unreadable_keeps_the_lane_with_the_reason(store_url, tmp_path):
    repo, argv = half_made_run(tmp_path)

    ran = lanes(repo, *argv)

    assert ran.returncode == EXIT_OK, (ran.stdout, ran.stderr)  # the batch completed; the Lane is kept
    assert "internal error" not in ran.stderr and ran.stderr == "", ran.stderr
    kept = next(line for line in ran.stdout.splitlines() if "kept the Lane of task-a" in line)
    assert "git worktree list failed" in kept and "half-made/commondir" in kept, kept
    assert "remove the directory holding it" in kept, kept
    assert (tmp_path / "lanes" / "task-a").is_dir()  # never removed on an unreadable list


def test_a_worktree_entry_another_git_command_is_writing_is_listed_again(store_url, tmp_path, capsys, monkeypatch):
    """The other coordinator's `git worktree add` finishes its entry right after the first list failed."""
    from lanes_es.adapters.git import SPAWN_OBSERVERS
    from lanes_es.cli.main import main

    repo, argv = half_made_run(tmp_path)
    commondir = Path(repo, ".git", "worktrees", "half-made", "commondir")
    lists: list[str] = []

    def finish_the_entry(args: tuple[str, ...]) -> None:
        if args[:2] == ("worktree", "list"):
            lists.append(commondir.read_text() if commondir.exists() else "absent")
            if commondir.exists() and not commondir.read_text():
                commondir.write_text("../..\n")

    monkeypatch.setenv("PYTHONPATH", PROJECT)
    monkeypatch.setattr("lanes_es.adapters.git.SPAWN_OBSERVERS", [*SPAWN_OBSERVERS, finish_the_entry])
    code = main(argv)

    told = capsys.readouterr().out
    assert code == EXIT_OK, told
    assert "" in lists and "steward: released the Lane of task-a" in told, (lists, told)
    assert not (tmp_path / "lanes" / "task-a").exists()
