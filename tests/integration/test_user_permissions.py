"""Permissions a user can get wrong, through the real command line run as a non-root user.

Everything else in the suite runs as root, which may write anywhere; here a system user made for
the test (`useradd`, once) runs `lanes-es` through `runuser`, on a demo repository it owns, and the
test takes away one permission at a time: the SQLite store's file or directory, the checkout's
`.imm/state`, `run --lanes-dir`, an Initiative or intent file. Each is one line on stderr naming
the thing, the cause and the next command, exit 2 (never 70), and nothing recorded.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import site
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from lanes_es.exit_codes import EXIT_OK, EXIT_REFUSED
from lanes_es.cli.demo import make_repository
from tests.system_user import ensure_system_user

PROJECT = str(Path(__file__).resolve().parents[2])
USER = "lanes-es-i11"
SLUG = "demo"


class AsUser:
    """Runs `lanes-es` as USER with an interpreter that user can execute."""

    def __init__(self, python: str, home: Path) -> None:
        self.python = python
        self.home = home

    def env(self, store: str | None) -> dict[str, str]:
        path = os.pathsep.join([PROJECT, *site.getsitepackages()])
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.home), "PYTHONPATH": path,
               "PYTHONDONTWRITEBYTECODE": "1", "LANG": "C.UTF-8"}
        if store is not None:
            env["LANES_ES_STORE"] = store
        if "LANES_ES_COORDINATOR" in os.environ:  # the suite's in-place mode (tests/conftest.py), through `env -i`
            env["LANES_ES_COORDINATOR"] = os.environ["LANES_ES_COORDINATOR"]
        return env

    def __call__(self, cwd: Path, *args: str, store: str | None = None) -> subprocess.CompletedProcess[str]:
        code = "import sys\nfrom lanes_es.cli.main import main\nsys.exit(main(sys.argv[1:]))"
        return subprocess.run(["runuser", "-u", USER, "--", "env", "-i", *(f"{k}={v}" for k, v in self.env(store).items()),
                               self.python, "-c", code, *args], cwd=cwd, text=True, capture_output=True,
                              stdin=subprocess.DEVNULL, timeout=120)


def _runnable_python(home: Path) -> str | None:
    """This interpreter when USER may run it, else the system's of the same version (the venv lives under /root)."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (sys.executable, f"/usr/bin/python{version}", f"/usr/local/bin/python{version}"):
        if not os.path.exists(candidate):
            continue
        probe = subprocess.run(["runuser", "-u", USER, "--", candidate, "-c",
                                f"import sys; assert '%d.%d' % sys.version_info[:2] == '{version}'"],
                               capture_output=True, cwd=home)
        if probe.returncode == 0:
            return candidate
    return None


@pytest.fixture(scope="session")
def as_user() -> Iterator[AsUser]:
    if os.geteuid() != 0:
        pytest.skip("making a non-root test user needs root; run as root, or these cases stay untested")
    ensure_system_user(USER)
    home = Path(tempfile.mkdtemp(prefix="lanes-es-perm-"))
    home.chmod(0o755)
    shutil.chown(home, USER, USER)
    python = _runnable_python(home)
    if python is None:
        shutil.rmtree(home, ignore_errors=True)
        pytest.skip(f"no Python {sys.version_info.major}.{sys.version_info.minor} that {USER} may run "
                    f"(this one, {sys.executable}, lives where only root may enter)")
    yield AsUser(python, home)
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def repo(as_user: AsUser, request: pytest.FixtureRequest) -> Path:
    """A demo repository USER owns, in a directory of its own."""
    place = Path(tempfile.mkdtemp(prefix="case-", dir=as_user.home))
    place.chmod(0o755)
    make_repository(place / "repo")
    subprocess.run(["chown", "-R", f"{USER}:{USER}", str(place)], check=True)
    return place / "repo"


@pytest.fixture
def store(store_url: str) -> str | None:
    """The store USER's commands use: the repository's own SQLite file, or the test's PostgreSQL schema."""
    return store_url if store_url.startswith("postgresql") else None


def refused(result: subprocess.CompletedProcess[str], *words: str) -> str:
    assert result.returncode == EXIT_REFUSED, (result.returncode, result.stdout, result.stderr)
    line = result.stderr.strip()
    assert "\n" not in line and "Traceback" not in line and "internal error" not in line, line
    for word in words:
        assert word in line, (word, line)
    return line


def started(as_user: AsUser, repo: Path, store: str | None) -> str:
    authorized = as_user(repo, "authorize", SLUG, "--yes", "--max-parallel", "2", store=store)
    assert authorized.returncode == EXIT_OK, authorized.stderr
    assert as_user(repo, "tick", SLUG, store=store).returncode == EXIT_OK
    return authorized.stdout.strip()


def recorded(as_user: AsUser, repo: Path, store: str | None) -> tuple[str, str]:
    """What the store says, read through the CLI: the batch's status and its whole log."""
    status = as_user(repo, "status", SLUG, "--json", store=store)
    batch_id = json.loads(status.stdout)["batch_id"] if status.returncode == EXIT_OK else ""
    log = as_user(repo, "export", batch_id, store=store).stdout if batch_id else ""
    return status.stdout + status.stderr, log


def digest(path: Path) -> str:
    return hashlib.sha256(b"".join(item.read_bytes() for item in sorted(path.iterdir()) if item.is_file())).hexdigest()


# ---------------------------------------------------------------- the store


@pytest.mark.parametrize("what", ["file", "directory"])
def test_a_store_the_user_cannot_write_serves_readers_and_refuses_writers(as_user, repo, what):
    """SQLite only: the store's own file and folder (a PostgreSQL role's grants are the server's business)."""
    batch_id = started(as_user, repo, None)
    store_file = repo / ".git" / "lanes-es" / "events.sqlite"
    (store_file if what == "file" else store_file.parent).chmod(0o444 if what == "file" else 0o555)
    before = digest(store_file.parent)
    out = repo.parent
    for args in (["status", SLUG], ["plan", SLUG], ["verify", batch_id], ["replay", batch_id],
                 ["rebuild", batch_id, "--check"], ["export", batch_id, "-o", str(out / "log.jsonl")],
                 ["audit", batch_id, "--html", str(out / "page.html")], ["batches"], ["flakes"]):
        result = as_user(repo, *args)
        assert result.returncode == EXIT_OK, (args, result.stderr)
    assert batch_id in as_user(repo, "batches").stdout
    for args in (["tick", SLUG], ["authorize", SLUG, "--yes", "--max-parallel", "2"], ["retire", SLUG, "--yes"],
                 ["rebuild", batch_id]):
        refused(as_user(repo, *args), str(store_file), "is read-only", "use a writable --store", "Read-only commands")
    assert digest(store_file.parent) == before


@pytest.mark.parametrize("what", ["file", "directory"])
def test_rebuild_all_check_on_a_store_the_user_cannot_write_folds_the_read_model_in_memory(as_user, repo, what):
    """SQLite only, as above. The check catches the read model up in memory (its stored lines, then the events
    after its position), so a read model that is only behind is clean and one edited by hand is drift."""
    import sqlite3

    batch_id = started(as_user, repo, None)
    store_file = repo / ".git" / "lanes-es" / "events.sqlite"
    assert as_user(repo, "batches").returncode == EXIT_OK  # the read model made and caught up
    (repo / "stray.txt").write_text("not the batch's\n")
    assert as_user(repo, "tick", SLUG).returncode == EXIT_REFUSED  # its TickRejected: the read model is behind
    (repo / "stray.txt").unlink()
    with sqlite3.connect(store_file) as connection:
        newest = connection.execute("SELECT max(rowid) FROM stored_events").fetchone()[0]
        folded = connection.execute("SELECT notification_id FROM tracking WHERE application_name = 'LanesES'")
        assert folded.fetchone()[0] == newest - 1
    connection.close()
    (store_file if what == "file" else store_file.parent).chmod(0o444 if what == "file" else 0o555)
    before = digest(store_file.parent)
    clean = as_user(repo, "rebuild", "--all", "--check")
    assert clean.returncode == EXIT_OK, (clean.stdout, clean.stderr)
    assert f"{batch_id}: no drift" in clean.stdout and "read model: 1 batch line(s), no drift" in clean.stdout
    assert digest(store_file.parent) == before

    (store_file if what == "file" else store_file.parent).chmod(0o644 if what == "file" else 0o755)
    with sqlite3.connect(store_file) as connection:  # a line edited behind the projection's back (as root)
        connection.execute("UPDATE lanes_batch_summaries SET batch_state = 'completed'")
    connection.close()
    (store_file if what == "file" else store_file.parent).chmod(0o444 if what == "file" else 0o555)
    before = digest(store_file.parent)
    drift = as_user(repo, "rebuild", "--all", "--check")
    assert drift.returncode == 1, (drift.stdout, drift.stderr)
    assert f"read model: 1 line(s) differs from the log: {batch_id}" in drift.stdout
    assert digest(store_file.parent) == before
    refused(as_user(repo, "rebuild", "--all"), str(store_file), "is read-only")  # repairing writes


def test_rebuild_all_check_on_a_read_only_store_without_a_read_model_is_clean(as_user, repo):
    """No `batches` ever ran where the store was writable: there is no read model table; caught up it would be
    the fold of the whole log, so nothing differs."""
    batch_id = started(as_user, repo, None)
    store_file = repo / ".git" / "lanes-es" / "events.sqlite"
    store_file.parent.chmod(0o555)
    before = digest(store_file.parent)
    clean = as_user(repo, "rebuild", "--all", "--check")
    assert clean.returncode == EXIT_OK, (clean.stdout, clean.stderr)
    assert f"{batch_id}: no drift" in clean.stdout and "read model: 1 batch line(s), no drift" in clean.stdout
    assert digest(store_file.parent) == before


# ---------------------------------------------------------------- the checkout and the Lanes


def test_a_state_directory_the_user_cannot_write_refuses_before_recording(as_user, repo, store):
    started(as_user, repo, store)
    state = repo / ".imm" / "state" / "batches"
    before = recorded(as_user, repo, store)
    for folder in (state, state.parent):
        folder.chmod(0o555)
    for args in (["tick", SLUG], ["retire", SLUG, "--yes"], ["authorize", SLUG, "--yes", "--max-parallel", "2"]):
        refused(as_user(repo, *args, store=store), "state_not_writable", str(state), "cannot be written by this user",
                f"chmod u+w {state}", f"`lanes-es {args[0]} {SLUG}` again")
    assert recorded(as_user, repo, store) == before
    for folder in (state.parent, state):
        folder.chmod(0o755)
    assert as_user(repo, "tick", SLUG, store=store).returncode == EXIT_OK  # fixed, the batch goes on


def test_run_refuses_a_lanes_dir_the_user_cannot_write_before_confirming(as_user, repo, store):
    lanes = repo.parent / "lanes"
    lanes.mkdir()
    shutil.chown(lanes, USER, USER)
    lanes.chmod(0o555)
    for target in (lanes, lanes / "deeper" / "still"):
        result = as_user(repo, "run", SLUG, "--max-parallel", "2", "--lanes-dir", str(target), "--executor", "true",
                         "--yes", store=store)
        refused(result, f"--lanes-dir {target}", "cannot be written by this user", f"chmod u+w {lanes}")
    assert list(lanes.iterdir()) == []
    refused(as_user(repo, "status", SLUG, store=store), "has no")  # nothing was confirmed


@pytest.mark.parametrize("which", ["initiative", "intent"])
def test_an_unreadable_initiative_or_intent_is_named_with_its_fix(as_user, repo, store, which):
    path = repo / ("docs/initiatives/demo.md" if which == "initiative" else "docs/plans/greet.intent.json")
    path.chmod(0o000)
    words = (str(path), "permission denied") if which == "initiative" else (str(path), "intent_unreadable",
                                                                            f"chmod u+r {path}")
    refused(as_user(repo, "authorize", SLUG, "--yes", "--max-parallel", "2", store=store), *words)
    refused(as_user(repo, "status", SLUG, store=store), "has no")  # nothing was confirmed
    plan = as_user(repo, "plan", SLUG, store=store)
    if which == "initiative":
        refused(plan, str(path), "permission denied")
    else:
        assert plan.returncode == EXIT_OK and "greet.intent.json cannot be opened: Permission denied" in plan.stdout
    path.chmod(0o644)
    started(as_user, repo, store)
    path.chmod(0o000)  # unreadable under a running batch: git cannot tell whether it changed
    before = recorded(as_user, repo, store)
    relative = str(path.relative_to(repo))
    tick = as_user(repo, "tick", SLUG, store=store)
    assert tick.returncode == EXIT_REFUSED, "OUT:" + tick.stdout + "ERR:" + tick.stderr
    assert f"{relative} cannot be read by this user" in tick.stderr and f"chmod u+r {relative}" in tick.stderr
    assert "move it out of the coordinator checkout" not in tick.stderr and tick.stdout == ""
    after = recorded(as_user, repo, store)[1].splitlines()
    assert after[:len(before[1].splitlines())] == before[1].splitlines()  # only the refusal's own audit event
    assert [line.endswith('TickRejected"}') for line in after[len(before[1].splitlines()):]] == [True]


def test_a_repository_another_user_owns_is_named_as_such(as_user, tmp_path):
    """git's safe.directory rule: not 'not a git repository'."""
    place = Path(tempfile.mkdtemp(prefix="root-owned-", dir=as_user.home))
    place.chmod(0o755)
    make_repository(place / "repo")
    subprocess.run(["chmod", "-R", "a+rX", str(place)], check=True)
    for args in (["plan", SLUG], ["status", SLUG]):
        refused(as_user(place / "repo", *args), "another user owns it", "safe.directory", str(place / "repo"))


# ---------------------------------------------------------------- the Executor's `task submit`


def offered_lane(as_user: AsUser, repo: Path, store: str | None) -> tuple[str, Path]:
    """The first provision handoff made into a Lane (as USER) and offered; the task's work written in it."""
    from lanes_es.cli.demo import TASKS

    assert as_user(repo, "authorize", SLUG, "--yes", "--max-parallel", "2", store=store).returncode == EXIT_OK
    tick = as_user(repo, "tick", SLUG, "--json", store=store)
    handoff = next(h for h in json.loads(tick.stdout)["handoffs"] if h["action"] == "provision")
    task, lane = handoff["task_id"], repo.parent / "lanes" / handoff["task_id"]
    subprocess.run(["runuser", "-u", USER, "--", "git", "worktree", "add", "-q", "-b", handoff["lane_branch"],
                    str(lane), handoff["base_head"]], cwd=repo, check=True, capture_output=True)
    offer = as_user(repo, "tick", SLUG, "--offer", f"{task}={lane}", store=store)
    assert offer.returncode == EXIT_OK, offer.stdout + offer.stderr
    (lane / TASKS[task][4]).parent.mkdir(parents=True, exist_ok=True)
    (lane / TASKS[task][4]).write_text(TASKS[task][5])
    subprocess.run(["chown", "-R", f"{USER}:{USER}", str(lane)], check=True)
    return task, lane


def lane_files(lane: Path) -> dict[str, bytes]:
    kernel = lane / ".imm" / "state" / "kernel"
    return {str(path.relative_to(kernel)): path.read_bytes() for path in sorted(kernel.rglob("*")) if path.is_file()}


@pytest.mark.parametrize("what", ["lane", "kernel", "tasks"])
def test_task_submit_in_a_lane_the_user_cannot_write_names_the_path_and_writes_nothing(as_user, repo, store, what):
    task, lane = offered_lane(as_user, repo, store)
    kernel = lane / ".imm" / "state" / "kernel"
    blocked = {"lane": lane, "kernel": kernel, "tasks": kernel / "tasks"}[what]
    if what == "lane":
        subprocess.run(["chmod", "-R", "a-w", str(lane)], check=True)
    else:
        blocked.chmod(0o555)
    before, log = lane_files(lane), recorded(as_user, repo, store)
    for args in (["task", "submit"], ["task", "stop", "--reason", "no"]):
        line = refused(as_user(lane, *args, store=store), str(kernel if what == "lane" else blocked),
                       "cannot be written by this user", f"chmod u+w", f"`lanes-es {' '.join(args[:2])}` again")
        assert line.startswith("lanes-es task: "), line
    assert not any(name.startswith(".tmp-") for name in os.listdir(blocked))
    assert lane_files(lane) == before and recorded(as_user, repo, store) == log
    subprocess.run(["chmod", "-R", "u+w", str(lane)], check=True)
    assert as_user(lane, "task", "submit", store=store).returncode == EXIT_OK  # fixed, it submits


def test_task_submit_needs_neither_the_coordinators_state_nor_the_store(as_user, repo, store):
    """The Executor's submit writes the Lane's own record only: a coordinator checkout's `.imm/state` or a
    store this user cannot write does not stop it (the coordinator's next tick says so, and writes nothing)."""
    task, lane = offered_lane(as_user, repo, store)
    state = repo / ".imm" / "state"
    log = recorded(as_user, repo, store)
    state.chmod(0o555)
    (state / "batches").chmod(0o555)
    if store is None:
        (repo / ".git" / "lanes-es").chmod(0o555)
    submitted = as_user(lane, "task", "submit", store=store)
    assert submitted.returncode == EXIT_OK, submitted.stderr
    assert recorded(as_user, repo, store) == log
    refused(as_user(repo, "tick", SLUG, store=store),
            *(["is read-only"] if store is None else ["state_not_writable", str(state / "batches")]))
    assert recorded(as_user, repo, store) == log
    subprocess.run(["chmod", "-R", "u+w", str(state), str(repo / ".git" / "lanes-es")], check=True)
    tick = as_user(repo, "tick", SLUG, "--json", store=store)  # fixed: the submission is not lost
    assert tick.returncode == EXIT_OK, tick.stdout + tick.stderr
    child = next(c for c in json.loads(tick.stdout)["children"] if c["task_id"] == task)
    assert child["state"] in ("completed", "integrated", "released"), child
