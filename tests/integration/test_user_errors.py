"""Every error a user can cause, through the real command line: one line, a code of the table, nothing written.

Each test runs `python -m lanes_es.cli.main` in a subprocess on a real repository (the demo's Initiative)
and a real store (SQLite and PostgreSQL: the `repo` fixture runs a test on each; `plain_repo` is for
what is about SQLite files or needs no store), and checks the exit code, that the message names the thing and the next step,
and that a refusal wrote nothing. The codes are lanes_es/exit_codes.py's.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from lanes_es.exit_codes import EXIT_FINDING, EXIT_OK, EXIT_PIPE_CLOSED, EXIT_REFUSED
from tests.store_rows import StoreRows, event_rows, store_exists, store_url_of
from lanes_es.cli.demo import make_repository

pytestmark = pytest.mark.coordinator_worktree

PROJECT = str(Path(__file__).resolve().parents[2])
SLUG = "demo"


def lanes(cwd: Path | str, *args: str, env: dict[str, str] | None = None, stdout: int | None = None,
          prelude: str = "") -> subprocess.CompletedProcess[str]:
    """`lanes-es ARGS` in `cwd`; `prelude` runs first in the same interpreter (to hide a module)."""
    code = f"{prelude}\nimport sys\nfrom lanes_es.cli.main import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, text=True, stdin=subprocess.DEVNULL,
                          stdout=stdout if stdout is not None else subprocess.PIPE, stderr=subprocess.PIPE,
                          env={**os.environ, "PYTHONPATH": PROJECT, **(env or {})}, timeout=120)


def refused(result: subprocess.CompletedProcess[str], *words: str) -> str:
    """Exit 2 with one line on stderr naming each of `words`, and no traceback."""
    assert result.returncode == EXIT_REFUSED, (result.returncode, result.stderr)
    line = result.stderr.strip()
    assert "Traceback" not in line and "internal error" not in line
    for word in words:
        assert word in line, (word, line)
    return line


@pytest.fixture
def repo(plain_repo: Path, store_url: str) -> Path:
    """The demo's repository; its commands use the test's store (LANES_ES_STORE), on each backend."""
    return plain_repo


def store_of(repo: Path) -> Path:
    return repo / ".git" / "lanes-es" / "events.sqlite"


def rows(repo: Path) -> list[tuple]:
    return event_rows(store_url_of(repo))


def authorized(repo: Path) -> str:
    result = lanes(repo, "authorize", SLUG, "--yes", "--max-parallel", "2")
    assert result.returncode == EXIT_OK, result.stderr
    return result.stdout.strip()


def started(repo: Path) -> str:
    batch_id = authorized(repo)
    assert lanes(repo, "tick", SLUG).returncode == EXIT_OK
    return batch_id


# ---------------------------------------------------------------- numbers at the edges, stuck batches


@pytest.mark.parametrize("flag", ["--max-parallel", "--max-children", "--qa-failure-limit"])
@pytest.mark.parametrize("value", ["99999999999999999999", "9007199254740992", "0", "-5", "two"])
def test_authorize_refuses_a_count_the_record_cannot_keep(repo, flag, value):
    line = refused(lanes(repo, "authorize", SLUG, "--yes", flag, value), flag, "positive integer")
    assert rows(repo) == []


def test_whatever_authorize_accepts_a_tick_can_start(repo):
    result = lanes(repo, "authorize", SLUG, "--yes", "--max-parallel", "9007199254740991")
    assert result.returncode == EXIT_OK
    tick = lanes(repo, "tick", SLUG, "--json")
    assert tick.returncode == EXIT_OK, tick.stderr
    assert json.loads(tick.stdout)["batch_state"] == "running"


def test_demo_refuses_a_negative_max_parallel_and_a_used_directory(tmp_path, plain_repo):
    repo = plain_repo
    refused(lanes(tmp_path, "demo", "--max-parallel", "-5"), "--max-parallel", "positive integer")
    before = sorted(path.name for path in tmp_path.iterdir())
    refused(lanes(tmp_path, "demo", "--dir", str(tmp_path)), f"{tmp_path / 'repo'} already exists", "lanes-es demo --dir")
    refused(lanes(tmp_path, "demo", "--dir", str(repo / "README.md")), "is a file")
    assert sorted(path.name for path in tmp_path.iterdir()) == before


def test_status_right_after_authorize_names_the_batch(repo):
    batch_id = authorized(repo)
    result = lanes(repo, "status", SLUG)
    assert result.returncode == EXIT_OK
    assert batch_id in result.stdout and "authorized, not started yet" in result.stdout
    assert f"lanes-es tick {SLUG}" in result.stdout
    as_json = json.loads(lanes(repo, "status", SLUG, "--json").stdout)
    assert as_json["batch_id"] == batch_id and as_json["batch_state"] == "authorized"


# ---------------------------------------------------------------- intents


def add_task(repo: Path, task_id: str, intent_task: str | None, track: bool) -> None:
    carrier = repo / "docs" / "initiatives" / f"{SLUG}.md"
    carrier.write_text(carrier.read_text() + f"\n## S9: more\n\nTasks:\n- {task_id}\n")
    subprocess.run(["git", "commit", "-qam", "more"], cwd=repo, check=True)
    if intent_task is not None:
        intent = json.loads((repo / "docs" / "plans" / "greet.intent.json").read_text())
        intent["task_id"] = intent_task
        (repo / "docs" / "plans" / f"{task_id}.intent.json").write_text(json.dumps(intent))
    if track:
        subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
        subprocess.run(["git", "commit", "-qm", "intent"], cwd=repo, check=True)


def test_an_untracked_intent_is_named_with_the_git_command(repo, monkeypatch):
    monkeypatch.setenv("LANES_ES_COORDINATOR", ".")  # the user's untracked file in the coordinator checkout itself
    add_task(repo, "extra", "extra", track=False)
    plan = lanes(repo, "plan", SLUG)
    assert plan.returncode == EXIT_OK
    assert "extra [needs_human: invalid_intent]" in plan.stdout
    assert "docs/plans/extra.intent.json is not tracked" in plan.stdout
    assert "git add docs/plans/extra.intent.json && git commit" in plan.stdout
    as_json = json.loads(lanes(repo, "plan", SLUG, "--json").stdout)
    assert "is not tracked" in as_json["intent_errors"]["extra"]
    # the untracked file would refuse the batch's first tick (a dirty tree): refused before anything is confirmed
    refused(lanes(repo, "authorize", SLUG, "--yes"), "dirty_working_tree", "docs/plans/extra.intent.json",
            "nothing was confirmed")
    assert rows(repo) == []
    # ignored by git, the untracked intent leaves the tree clean: the batch is confirmed without it
    with open(repo / ".git" / "info" / "exclude", "a") as exclude:
        exclude.write("docs/plans/extra.intent.json\n")
    authorize = lanes(repo, "authorize", SLUG, "--yes")
    assert authorize.returncode == EXIT_OK and "extra is excluded" in authorize.stderr


def test_an_intent_naming_another_task_says_so(plain_repo):  # plan reads no store
    repo = plain_repo
    add_task(repo, "extra", "other", track=True)
    assert "names task other, not extra" in lanes(repo, "plan", SLUG).stdout


def test_a_plan_with_nothing_enrollable_keeps_each_cause(tmp_path, store_url):
    root = tmp_path / "one"
    make_repository(root)
    carrier = root / "docs" / "initiatives" / "solo.md"
    carrier.write_text("# Solo\n\n## S1: one\n\nTasks:\n- lonely\n")
    subprocess.run(["git", "add", "-A"], cwd=root, check=True)
    subprocess.run(["git", "commit", "-qm", "solo"], cwd=root, check=True)
    (root / "docs" / "plans" / "lonely.intent.json").write_text("{not json")
    refused(lanes(root, "authorize", "solo", "--yes"), "empty_enrollable_set", "lonely:",
            "docs/plans/lonely.intent.json is not tracked")
    assert rows(root) == []


@pytest.mark.parametrize("argument", ["--colour=\x1b[31m", "two\nlines", "nul\x00", "del\x7f"])
def test_a_check_argument_with_a_control_character_is_refused_before_confirming(repo, argument):
    """Upstream's intent validator takes any `verification` string (docs/upstream.md#taskintent-v1); descriptor v2 forbids control
    characters in argv (docs/upstream.md#the-descriptor-rerun-and-deterministic-qa), so such a check could never run: refused at plan and authorize, shown escaped."""
    path = repo / "docs" / "plans" / "greet.intent.json"
    intent = json.loads(path.read_text())
    descriptor = json.loads(intent["acceptance"][0]["verification"])
    descriptor["command"]["argv"].append(argument)
    intent["acceptance"][0]["verification"] = json.dumps(descriptor)
    path.write_text(json.dumps(intent, indent=2) + "\n")
    subprocess.run(["git", "commit", "-qam", "a control character"], cwd=repo, check=True)
    words = ("invalid_verification_descriptor", "task greet", "docs/plans/greet.intent.json", "acceptance A1",
             f"command.argv[2] {argument!r}", "control character", "nothing was confirmed",
             "correct the descriptor in docs/plans/greet.intent.json, commit it", f"`lanes-es plan {SLUG}` again")
    for command in (["plan", SLUG], ["plan", SLUG, "--json"], ["authorize", SLUG, "--yes", "--max-parallel", "2"]):
        line = refused(lanes(repo, *command), *words)
        assert "\n" not in line and "\x1b" not in line and "\x00" not in line  # escaped, never raw
    assert rows(repo) == []
    refused(lanes(repo, "status", SLUG), "has no batch")


def test_a_task_id_that_is_no_id_is_a_plan_refusal(repo):
    add_task(repo, "../../etc/passwd", None, track=False)
    refused(lanes(repo, "plan", SLUG), "invalid task_id")
    refused(lanes(repo, "authorize", SLUG, "--yes"), "invalid task_id")


# ---------------------------------------------------------------- the store


def test_a_directory_an_unknown_scheme_an_empty_or_foreign_file_as_store(plain_repo, tmp_path):
    """About paths and SQLite files given as the store: SQLite only."""
    repo = plain_repo
    refused(lanes(repo, "--store", str(tmp_path), "status", SLUG), str(tmp_path), "is a directory", "--store")
    refused(lanes(repo, "--store", "foo://x", "status", SLUG), "unknown store URL 'foo://x'", "postgresql://")
    empty = tmp_path / "empty.sqlite"
    empty.write_bytes(b"")
    for command in (["status", SLUG], ["authorize", SLUG, "--yes"], ["verify", "batch-demo-1"]):
        refused(lanes(repo, "--store", str(empty), *command), str(empty), "empty file", "not re-created")
    assert empty.read_bytes() == b""
    foreign = tmp_path / "notes.txt"
    foreign.write_text("my notes\n")
    refused(lanes(repo, "--store", str(foreign), "authorize", SLUG, "--yes"), "not a SQLite file")
    assert foreign.read_text() == "my notes\n"


def read_only_mount(directory: Path, *command: str) -> subprocess.CompletedProcess[str]:
    """`command` run where `directory` is a read-only mount (a private mount namespace)."""
    script = f'mount --bind "$1" "$1" && mount -o remount,ro,bind "$1" && shift && exec "$@"'
    return subprocess.run(["unshare", "-m", "sh", "-c", script, "sh", str(directory), *command],
                          capture_output=True, text=True, timeout=120)


def test_read_only_commands_work_on_a_read_only_store_and_writers_say_why(plain_repo, monkeypatch):
    """A SQLite file on a read-only disk: SQLite only (a PostgreSQL store's permissions are the server's)."""
    repo = plain_repo
    batch_id = started(repo)
    probe = read_only_mount(store_of(repo).parent, "true")
    if probe.returncode != 0:
        pytest.skip(f"no private mount namespace here ({probe.stderr.strip()})")
    command = [sys.executable, "-c", "import sys; from lanes_es.cli.main import main; sys.exit(main(sys.argv[1:]))",
               "--root", str(repo)]
    # For the commands under the mount; undone after the test (left in the worker's environment, it made a
    # later module's pip see the source tree's lanes_es as installed and skip the wheel).
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH") or PROJECT)
    for args in (["status", SLUG], ["verify", batch_id], ["replay", batch_id], ["rebuild", batch_id, "--check"],
                 ["plan", SLUG]):
        result = read_only_mount(store_of(repo).parent, *command, *args)
        assert result.returncode == EXIT_OK, (args, result.stderr)
    tick = read_only_mount(store_of(repo).parent, *command, "tick", SLUG)
    refused(tick, str(store_of(repo)), "is read-only", "Read-only commands")


def test_postgresql_refused_unreachable_unauthenticated_and_missing_extra(plain_repo):
    """Each names its own PostgreSQL URL: once is enough."""
    repo = plain_repo
    refused(lanes(repo, "--store", "postgresql://postgres@127.0.0.1:1/x", "status", SLUG),
            "postgresql://postgres@127.0.0.1:1/x", "refused the connection", "127.0.0.1:1")
    refused(lanes(repo, "--store", "postgresql://no_such_role_i11@127.0.0.1:5432/test", "status", SLUG),
            "no_such_role_i11", "authentication")
    refused(lanes(repo, "--store", "postgresql://postgres@127.0.0.1:5432/no_such_db_i11", "status", SLUG),
            "no database no_such_db_i11")
    hidden = "import sys; sys.modules['psycopg'] = None"
    refused(lanes(repo, "status", SLUG, env={"LANES_ES_STORE": "postgresql://postgres@127.0.0.1/test"},
                  prelude=hidden), "PostgreSQL extra", "pip install 'lanes-es[postgres]'")


ROLE_WITHOUT_GRANTS = "lanes_es_i11_nogrants"


@pytest.fixture
def role_without_grants() -> Iterator[str]:
    """A LOGIN role of the test server with no privilege on anything the test makes (made idempotently,
    dropped after with whatever it was granted)."""
    from tests.conftest import postgres_statement

    postgres_statement(f"DO $$BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{ROLE_WITHOUT_GRANTS}') "
                       f"THEN CREATE ROLE {ROLE_WITHOUT_GRANTS} LOGIN; END IF; END$$")
    try:
        yield ROLE_WITHOUT_GRANTS
    finally:
        postgres_statement(f"DROP OWNED BY {ROLE_WITHOUT_GRANTS}")
        postgres_statement(f"DROP ROLE IF EXISTS {ROLE_WITHOUT_GRANTS}")


def test_a_postgresql_role_without_grants_is_told_what_to_grant_and_writes_nothing(plain_repo, role_without_grants,
                                                                                    tmp_path_factory):
    """PostgreSQL only: grants are the server's (a SQLite file the user cannot write is in
    test_user_permissions.py). Another role made the store; this one logs in (trust auth, so its password
    is only there to show it never reaches the message) and lacks, grant by grant, what each command needs."""
    from tests.conftest import backend_store, postgres_statement
    from tests.gitfixtures import run_git
    from tests.store_rows import postgres_schema

    role = role_without_grants
    with backend_store("postgresql", tmp_path_factory) as owner_url:
        owner = {"LANES_ES_STORE": owner_url}
        batch_id = lanes(plain_repo, "authorize", SLUG, "--yes", "--max-parallel", "2", env=owner).stdout.strip()
        assert batch_id.startswith("batch-")
        started = lanes(plain_repo, "tick", SLUG, "--json", env=owner)
        assert started.returncode == EXIT_OK
        handoff = next(h for h in json.loads(started.stdout)["handoffs"] if h["action"] == "provision")
        schema = postgres_schema(owner_url)
        url = owner_url.replace("postgres@", f"{role}:s3cret@")
        shown = url.replace(":s3cret@", ":***@")
        before = event_rows(owner_url)
        mine = {"LANES_ES_STORE": url}
        reads, writes = (["status", SLUG], ["verify", batch_id]), (["tick", SLUG], ["authorize", SLUG, "--yes"])

        def refused_all(commands, *words):
            for args in commands:
                line = refused(lanes(plain_repo, *args, env=mine), shown, f"refused user {role}", *words)
                assert "\n" not in line and "s3cret" not in line, line
            assert event_rows(owner_url) == before

        refused_all(reads, f"permission denied for schema {schema}", "nothing was written",
                    f"GRANT USAGE ON SCHEMA {schema} TO {role}")
        refused_all(writes, f"permission denied for schema {schema}", "nothing was written",
                    f"GRANT USAGE, CREATE ON SCHEMA {schema} TO {role}")
        postgres_statement(f"GRANT USAGE ON SCHEMA {schema} TO {role}")
        refused_all(reads + (["batches"],), "permission denied for table laneses_events",
                    f"GRANT SELECT ON ALL TABLES IN SCHEMA {schema} TO {role}")
        postgres_statement(f"GRANT SELECT ON ALL TABLES IN SCHEMA {schema} TO {role}")
        for args in (*reads, ["batches"]):  # reads now work; the read model is folded in memory, not made
            result = lanes(plain_repo, *args, env=mine)
            assert result.returncode == EXIT_OK, (args, result.stderr)
        missing = "batch-demo-00000000-0000-4000-8000-000000000000"
        for args in (["status", "--batch", missing], ["rebuild", missing, "--check"]):
            assert "s3cret" not in refused(lanes(plain_repo, *args, env=mine), "batch_not_found")
        appends = ("permission denied to append to table laneses_events", f"GRANT USAGE, CREATE ON SCHEMA {schema}",
                   f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {role}",
                   f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA {schema} TO {role}")
        refused_all(writes, *appends)  # refused before the command does anything, not at its first append
        postgres_statement(f"GRANT CREATE ON SCHEMA {schema} TO {role}")
        postgres_statement(f"GRANT INSERT ON ALL TABLES IN SCHEMA {schema} TO {role}")
        refused_all(writes, *appends)  # without UPDATE, eventsourcing cannot lock the log to number an event
        postgres_statement(f"GRANT UPDATE ON ALL TABLES IN SCHEMA {schema} TO {role}")
        postgres_statement(f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA {schema} TO {role}")
        # Granted, a role that does not own the store writes to it (the tables are there: it makes none).
        lane = tmp_path_factory.mktemp("lanes") / "lane"
        run_git(plain_repo, "worktree", "add", "-q", "-b", handoff["lane_branch"], str(lane), handoff["base_head"])
        offered = lanes(plain_repo, "tick", SLUG, "--offer", f"{handoff['task_id']}={lane}", env=mine)
        assert offered.returncode == EXIT_OK, offered.stderr
        assert len(event_rows(owner_url)) > len(before)
        assert lanes(plain_repo, "verify", batch_id, env=mine).returncode == EXIT_OK

    with backend_store("postgresql", tmp_path_factory) as fresh_url:  # a new store the role may not make
        schema = postgres_schema(fresh_url)
        postgres_statement(f"GRANT USAGE ON SCHEMA {schema} TO {role}")
        mine = {"LANES_ES_STORE": fresh_url.replace("postgres@", f"{role}@")}
        refused(lanes(plain_repo, "authorize", SLUG, "--yes", env=mine), f"permission denied for schema {schema}",
                f"a command that makes the store needs GRANT USAGE, CREATE ON SCHEMA {schema} TO {role}")
        assert not store_exists(fresh_url)
        assert lanes(plain_repo, "status", SLUG, env=mine).returncode == EXIT_REFUSED  # "has no batch", as empty
    missing = {"LANES_ES_STORE": f"{fresh_url.replace('postgres@', f'{role}@')}_gone"}  # a schema of no one
    refused(lanes(plain_repo, "authorize", SLUG, "--yes", env=missing), f"names schema {schema}_gone, which database "
            f"test does not have", f"CREATE SCHEMA {schema}_gone AUTHORIZATION {role}", "fix ?schema= in the URL")


def test_the_embedded_default_runs_every_store_command_without_the_postgresql_extra(plain_repo):
    """psycopg comes only with the `postgres` extra: nothing on the SQLite path may import it (the read
    model's PostgreSQL view once did, and `batches` and `rebuild --all` ended in an internal error)."""
    batch_id = started(plain_repo)
    hidden = "import sys; sys.modules['psycopg'] = None"
    for args in (["batches"], ["rebuild", "--all", "--check"], ["rebuild", "--all"], ["status", SLUG],
                 ["verify", batch_id], ["replay", batch_id]):
        result = lanes(plain_repo, *args, prelude=hidden)
        assert result.returncode == EXIT_OK, (args, result.stdout[-2000:], result.stderr)
        assert "internal error" not in result.stdout + result.stderr


DAMAGE = {
    "bad_json": "UPDATE {events} SET state = ? WHERE originator_id = ? AND originator_version = 2",
    "bad_topic": "UPDATE {events} SET topic = 'nope:X' WHERE originator_id = ? AND originator_version = 2",
    "gap": "DELETE FROM {events} WHERE originator_id = ? AND originator_version = 1",
}


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_a_damaged_store_is_a_finding_for_verify_and_a_pointer_for_the_rest(repo, kind):
    batch_id = started(repo)
    args = (b"{", batch_id) if kind == "bad_json" else (batch_id,)
    assert StoreRows(store_url_of(repo)).execute(DAMAGE[kind], *args) == 1
    found_and_pointed_at(repo, batch_id)


def test_a_text_row_in_a_sqlite_store_is_a_finding_too(plain_repo):
    """SQLite keeps any type in any column, so a row rewritten as TEXT can happen there only (PostgreSQL's
    bytea column refuses it)."""
    batch_id = started(plain_repo)
    assert StoreRows(str(store_of(plain_repo))).execute(
        "UPDATE {events} SET state = CAST(state AS TEXT) WHERE originator_id = ? AND originator_version = 2",
        batch_id) == 1
    found_and_pointed_at(plain_repo, batch_id)


def found_and_pointed_at(repo: Path, batch_id: str) -> None:
    before = rows(repo)
    verify = lanes(repo, "verify", batch_id)
    assert verify.returncode == EXIT_FINDING, verify.stderr
    assert "FAIL" in verify.stdout and "NOT verified" in verify.stdout and verify.stderr.strip() == ""
    assert lanes(repo, "verify", batch_id, "--json").returncode == EXIT_FINDING
    assert lanes(repo, "replay", batch_id).returncode == EXIT_FINDING
    for command in (["status", SLUG], ["tick", SLUG], ["status", "--batch", batch_id]):
        refused(lanes(repo, *command), batch_id, f"lanes-es verify {batch_id}")
    assert rows(repo) == before


# ---------------------------------------------------------------- pipes and disks


def closed_pipe(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    reader, writer = os.pipe()
    os.close(reader)
    try:
        return lanes(cwd, *args, stdout=writer)
    finally:
        os.close(writer)


def test_a_closed_pipe_ends_quietly(repo):
    batch_id = started(repo)
    for args in (["replay", batch_id], ["export", batch_id], ["tick", SLUG], ["status", SLUG, "--json"],
                 ["plan", SLUG]):
        result = closed_pipe(repo, *args)
        assert result.returncode == EXIT_PIPE_CLOSED, (args, result.stderr)
        assert result.stderr == "", args


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_full_disk_is_named(repo, tmp_path):
    batch_id = started(repo)
    with open("/dev/full", "w") as full:
        result = lanes(repo, "replay", batch_id, stdout=full.fileno())
    refused(result, "cannot use the output (stdout)", "the disk is full")
    exported = lanes(repo, "export", batch_id, "-o", "/dev/full")
    refused(exported, "/dev/full")


# ---------------------------------------------------------------- offers


def test_a_refused_offer_exits_2_and_a_missing_path_is_named(repo, tmp_path):
    started(repo)
    missing = tmp_path / "no-such-lane"
    result = lanes(repo, "tick", SLUG, "--offer", f"greet={missing}")
    assert result.returncode == EXIT_REFUSED
    assert f"refused offer: greet at {missing}" in result.stdout
    assert "is not a directory: make the Lane first" in result.stdout


def test_store_checks_leave_a_fresh_store_alone_for_read_only_commands(repo, tmp_path):
    """A read-only command in a repository with no store yet creates none and writes nothing: no SQLite file, and
    in a fresh PostgreSQL schema no table, type or function. Each answers as for an empty store."""
    missing = "batch-demo-00000000-0000-4000-8000-000000000000"
    refused(lanes(repo, "status", SLUG), "has no batch yet")
    assert lanes(repo, "plan", SLUG).returncode == EXIT_OK
    for args in (["status", "--batch", missing], ["verify", missing], ["replay", missing], ["export", missing],
                 ["audit", missing, "--html", str(tmp_path / "page.html")]):
        refused(lanes(repo, *args), "batch_not_found", missing)
    for args, said in ((["batches"], "no batch in this store yet; `lanes-es authorize SLUG` starts one"), (["batches", "--json"], "[]"),
                       (["rebuild", "--all", "--check"], "read model: 0 batch line(s), no drift"),
                       (["flakes"], "no check passed only on a rerun")):
        result = lanes(repo, *args)
        assert result.returncode == EXIT_OK and result.stdout.strip() == said, (args, result.stdout, result.stderr)
    assert not store_of(repo).exists() and rows(repo) == []
    assert not store_exists(store_url_of(repo))
    authorized(repo)  # a command that writes makes the store: what the check above looks for is there
    assert store_exists(store_url_of(repo))
    assert lanes(repo, "status", SLUG).returncode == EXIT_OK


def fingerprint(path: Path) -> str:
    digest = hashlib.sha256()
    for item in sorted(path.rglob("*")):
        if item.is_file():
            digest.update(str(item).encode() + item.read_bytes())
    return digest.hexdigest()


def test_fingerprint_sees_a_change(tmp_path):
    """The property test's 'nothing written' relies on this."""
    (tmp_path / "a").write_text("1")
    before = fingerprint(tmp_path)
    (tmp_path / "a").write_text("2")
    assert fingerprint(tmp_path) != before


__all__ = ["lanes", "fingerprint", "refused", "shutil"]


# ---------------------------------------------------------------- the autopilot and the Lane


def test_run_refuses_an_unusable_executor_or_lanes_dir_before_confirming(repo, tmp_path):
    lanes_file = tmp_path / "lanes-file"
    lanes_file.write_text("")
    for executor, lanes_dir, words in (
            ("no-such-binary-i11", tmp_path / "lanes", ("'no-such-binary-i11' is not on PATH",)),
            ("/nonexistent/agent", tmp_path / "lanes", ("/nonexistent/agent does not exist",)),
            ("", tmp_path / "lanes", ("--executor is empty",)),
            ("true", lanes_file, (f"--lanes-dir {lanes_file} is a file",))):
        refused(lanes(repo, "run", SLUG, "--max-parallel", "2", "--lanes-dir", str(lanes_dir), "--executor",
                      executor, "--yes"), *words)
    assert rows(repo) == []
    assert not (tmp_path / "lanes").exists()


def test_a_refused_run_says_so_on_stderr_and_json_keeps_it_on_stdout(repo, tmp_path):
    """A refusal the autopilot makes (an Initiative that does not exist) is one line on stderr, as every other
    command's, and nothing on stdout: a run whose output goes to a file still tells the person why it
    stopped. With --json it is a `refused` item among the run's others, on stdout."""
    args = ("run", "nosuch", "--max-parallel", "2", "--lanes-dir", str(tmp_path / "lanes"), "--executor", "true",
            "--yes")
    result = lanes(repo, *args)
    refused(result, "lanes-es run: plan_projection_failed", "docs/initiatives/nosuch.md does not exist")
    assert result.stdout == ""
    as_json = lanes(repo, *args, "--json")
    assert as_json.returncode == EXIT_REFUSED and as_json.stderr == "", as_json.stderr
    items = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert [(item["action"], item["reason"]) for item in items if item.get("action") == "refused"] == [
        ("refused", "plan_projection_failed")], items
    assert rows(repo) == []


LANES_ES = str(Path(sys.executable).with_name("lanes-es"))  # the installed command (the venv's)


def try_it_script(help_text: str) -> str:
    """The shell lines of the "Try it" example of `run --help`, as printed (continuations joined)."""
    block = help_text.split("Try it", 1)[1].split("\n\n", 1)[1].split("\n\n", 1)[0]
    return block.replace("\\\n", " ")


def test_the_run_help_try_it_example_runs_the_demo_to_the_end(tmp_path, store_url):
    """The example as printed, run by a shell with the installed lanes-es on PATH, completes the demo batch."""
    help_text = subprocess.run([LANES_ES, "run", "--help"], capture_output=True, text=True, check=True).stdout
    script = try_it_script(help_text)
    assert "lanes-es demo --dir" in script and "run demo" in script and "--executor" in script
    env = {**os.environ, "PATH": f"{Path(LANES_ES).parent}{os.pathsep}{os.environ['PATH']}", "TMPDIR": str(tmp_path)}
    env.pop("PYTHONPATH", None)  # as a user's shell: lanes-es as installed, nothing borrowed from the test
    result = subprocess.run(["bash", "-euc", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                            stdin=subprocess.DEVNULL, timeout=300)
    assert result.returncode == EXIT_OK, result.stdout[-3000:] + result.stderr
    assert "completed: all enrollable children integrated" in result.stdout
    (made,) = [path for path in tmp_path.iterdir() if path.is_dir()]
    record = json.loads(lanes(made / "repo", "status", SLUG, "--json").stdout)
    assert record["batch_state"] == "completed" and len(record["commits"]) == 6


def test_task_status_in_a_parked_lane_says_parked_not_done(tmp_path, store_url):
    from tests.engine import Engine, Task

    engine = Engine.create(tmp_path, {"task-a": Task(["a.txt"])})
    engine.authorize()
    lane = engine.provision("task-a", engine.tick())
    engine.tick({"task-a": lane})
    engine.deliver("task-a", "b.txt", "outside the scope\n")
    for _ in range(3):
        report = engine.tick()
    assert report["children"][0]["state"] == "needs_human"
    status = lanes(lane, "task", "status")
    assert status.returncode == EXIT_OK
    assert "the coordinator parked this task (dirty_outside_scope" in status.stdout
    assert "done: the coordinator commits" not in status.stdout
    assert json.loads(lanes(lane, "task", "status", "--json").stdout)["batch_child"]["state"] == "needs_human"


# ---------------------------------------------------------------- files in the wrong encoding


def test_a_carrier_not_in_utf8_is_named(plain_repo):  # plan reads no store
    repo = plain_repo
    (repo / "docs" / "initiatives" / "latin.md").write_bytes("# D\n\n## S1: café\n\nTasks:\n- greet\n".encode("latin-1"))
    refused(lanes(repo, "plan", "latin"), "docs/initiatives/latin.md is not UTF-8 text", "save it as UTF-8")


def test_a_damaged_export_is_a_finding_and_a_missing_one_bad_input(repo, tmp_path):
    damaged = tmp_path / "damaged.jsonl"
    damaged.write_bytes(b"\xff\xfe{not json")
    result = lanes(repo, "verify", "--export", str(damaged))
    assert result.returncode == EXIT_FINDING and "FAIL export: unreadable_export" in result.stdout
    refused(lanes(repo, "verify", "--export", str(tmp_path / "missing.jsonl")), "cannot read the export")
    refused(lanes(repo, "rebuild", "--from-export", str(damaged)), "invalid_export")


# ---------------------------------------------------------------- Ctrl-C in the autopilot

HELD_EXECUTOR = """\
import os, pathlib, sys, time
marks = pathlib.Path(sys.argv[1])
mark = marks / (os.environ["LANES_ES_TASK_ID"] + ".started")
mark.with_suffix(".tmp").write_text(str(os.getpid()))
os.replace(mark.with_suffix(".tmp"), mark)  # whole, or not there: the test reads it as soon as it exists
while not (marks / "go").exists():  # held until the test lets it deliver
    time.sleep(0.05)
os.execv(sys.executable, [sys.executable, "-P", "-m", "lanes_es.cli.example_executor"])
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"


# Each way of interrupting once, the backends shared out between them (the store only records the run): CI time.
@pytest.mark.parametrize("store_url, whom", [("sqlite", "process_group"), ("postgresql", "autopilot_only")],
                         indirect=["store_url"])
def test_ctrl_c_while_executors_work_says_what_happened_and_the_next_run_goes_on(tmp_path, store_url, whom):
    """SIGINT to the terminal's process group (Ctrl-C: the Executors get it too) or to the autopilot alone."""
    import signal
    import time

    from lanes_es.cli.demo import executor_hints

    repo, marks = tmp_path / "repo", tmp_path / "marks"
    make_repository(repo)
    marks.mkdir()
    (tmp_path / "held.py").write_text(HELD_EXECUTOR)
    command = [LANES_ES, "--root", str(repo), "run", SLUG, "--max-parallel", "2", "--lanes-dir", str(tmp_path / "lanes"),
               "--executor", f"{sys.executable} -P {tmp_path / 'held.py'} {marks}", "--yes", "--poll", "0.05"]
    env = {**os.environ, "LANES_ES_EXECUTOR_HINT": json.dumps(executor_hints())}
    first = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 60
    while len(list(marks.glob("*.started"))) < 2 and time.monotonic() < deadline and first.poll() is None:
        time.sleep(0.05)
    started = {path.name.split(".")[0]: int(path.read_text()) for path in marks.glob("*.started")}
    assert len(started) == 2, first.communicate()
    if whom == "process_group":
        os.killpg(first.pid, signal.SIGINT)
    else:
        first.send_signal(signal.SIGINT)
    out, err = first.communicate(timeout=60)
    assert first.returncode == 130, out + err
    assert "Traceback" not in err and "internal error" not in out + err
    line = next(line for line in out.splitlines() if line.startswith("lanes-es run: interrupted"))
    assert "Run the same command again to go on" in line
    tasks = sorted(started)
    if whom == "process_group":
        assert f"the Executors of {', '.join(tasks)} stopped with it" in line and "still working" not in line
        assert not any(alive(pid) for pid in started.values())
    else:
        working = ", ".join(f"{task} (pid {started[task]})" for task in tasks)
        assert f"Executors still working: {working}" in line and "stopped with it" not in line
        assert all(alive(pid) for pid in started.values())
    batch_id = next(word for word in out.split() if word.startswith("batch-demo-"))

    (marks / "go").write_text("")
    again = subprocess.run(command, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    assert again.returncode == EXIT_OK, again.stdout[-3000:] + again.stderr
    assert "Start the unattended" not in again.stdout  # the same batch, not a new confirmation
    assert f"batch {batch_id}: completed: all enrollable children integrated" in again.stdout
    for task in tasks:  # a killed Executor was started again; a surviving one was waited for, never doubled
        headers = (tmp_path / "lanes" / ".executor-logs" / f"{task}.log").read_text().count("--- lanes-es run:")
        assert headers == (2 if whom == "process_group" else 1), task


# ---------------------------------------------------------------- found by trying (encodings, places, env, disks)


@pytest.mark.parametrize("saved", ["utf-16", "bom"])
def test_an_intent_saved_as_utf16_or_with_a_bom_says_how_to_save_it(repo, saved):
    path = repo / "docs" / "plans" / "greet.intent.json"
    text = path.read_text()
    path.write_bytes(text.encode("utf-16") if saved == "utf-16" else b"\xef\xbb\xbf" + text.encode())
    subprocess.run(["git", "commit", "-qam", saved], cwd=repo, check=True)
    words = "is UTF-16 text, not UTF-8; save it as UTF-8" if saved == "utf-16" else "byte-order mark (BOM)"
    plan = lanes(repo, "plan", SLUG)
    assert plan.returncode == EXIT_OK and words in plan.stdout and "codec" not in plan.stdout
    refused(lanes(repo, "intent", "overlap", str(path)), str(path), words)


def test_an_initiative_in_utf16_is_named_as_such(repo):
    carrier = repo / "docs" / "initiatives" / "wide.md"
    carrier.write_bytes((repo / "docs" / "initiatives" / f"{SLUG}.md").read_text().encode("utf-16"))
    refused(lanes(repo, "plan", "wide"), "docs/initiatives/wide.md is UTF-16 text, not UTF-8", "save it as UTF-8")


def test_a_store_named_on_a_missing_directory_inside_the_checkout_or_empty_is_refused(plain_repo, tmp_path):
    """SQLite paths only: where a store file may be made."""
    repo = plain_repo
    missing = tmp_path / "no-such-dir" / "deeper" / "events.sqlite"
    refused(lanes(repo, "--store", str(missing), "authorize", SLUG, "--yes"), str(missing),
            f"{missing.parent}, which does not exist", f"mkdir -p {missing.parent}")
    assert not (tmp_path / "no-such-dir").exists()
    refused(lanes(repo, "authorize", SLUG, "--yes", env={"LANES_ES_STORE": "typo.sqlite"}),
            "inside the coordinator checkout", "--store")
    assert not (repo / "typo.sqlite").exists()
    for empty in ("sqlite://", "   "):
        refused(lanes(repo, "authorize", SLUG, "--yes", env={"LANES_ES_STORE": empty}), "names no file")
    assert rows(repo) == []
    beside = tmp_path / "beside.sqlite"  # an existing directory outside the checkout is fine
    assert lanes(repo, "--store", str(beside), "authorize", SLUG, "--yes").returncode == EXIT_OK


def test_a_signing_or_public_key_that_is_no_text_is_refused_not_a_crash(repo):
    batch_id = started(repo)
    binary = shutil.which("true") or "/bin/true"
    refused(lanes(repo, "key", "show", env={"LANES_ES_SIGNING_KEY": binary}), binary, "not a signing key",
            "LANES_ES_SIGNING_KEY")
    refused(lanes(repo, "verify", batch_id, env={"LANES_ES_PUBLIC_KEY": binary}), binary, "not text",
            "lanes-es key show")


def test_a_stats_file_that_cannot_be_written_refuses_before_the_tick(repo, tmp_path):
    batch_id = authorized(repo)
    for bad in (tmp_path / "no-such-dir" / "stats.jsonl", tmp_path):
        refused(lanes(repo, "tick", SLUG, env={"LANES_ES_STATS": str(bad)}), f"LANES_ES_STATS={bad}",
                "nothing was ticked", "unset LANES_ES_STATS")
    assert [row for row in rows(repo) if row[0] == batch_id] == []
    program, document = tmp_path / "program", tmp_path / "notes.txt"
    program.write_bytes(b"\x7fELF\x02\x01\x01\x00 a program")
    program.chmod(0o755)
    document.write_text("my own notes\n")
    for foreign, why in ((program, "an executable file"), (document, "no JSON line lanes-es wrote")):
        before = foreign.read_bytes()
        refused(lanes(repo, "tick", SLUG, env={"LANES_ES_STATS": str(foreign)}), f"LANES_ES_STATS={foreign}", why,
                "nothing was ticked")
        assert foreign.read_bytes() == before  # a file of the user's is never appended to
    assert [row for row in rows(repo) if row[0] == batch_id] == []
    if os.path.exists("/dev/full"):  # the tick ran: a full stats file after it is a warning, not a refusal
        tick = lanes(repo, "tick", SLUG, env={"LANES_ES_STATS": "/dev/full"})
        assert tick.returncode == EXIT_OK and "tick statistics not written to /dev/full" in tick.stderr


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 3 MiB tmpfs, unmounted after the test; skipped where mounting is not allowed."""
    place = tmp_path / "small"
    place.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(place)], capture_output=True,
                             text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.strip()}")
    try:
        yield place
    finally:
        subprocess.run(["umount", "-l", str(place)], check=False)


def fill(disk: Path, leave_kib: int) -> Path:
    filler = disk / "filler"
    filler.unlink(missing_ok=True)
    free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
    with open(filler, "wb") as handle:
        handle.truncate(0)
        handle.write(b"\0" * max(free - leave_kib * 1024, 0))
    return filler


@pytest.mark.parametrize("leave_kib", [8, 30, 40, 50, 60, 70, 73, 80, 100])
def test_a_full_disk_at_any_point_of_a_tick_is_named_and_loses_nothing(small_disk, leave_kib):
    """The space left decides which write of the tick fails first: SQLite opening its WAL ("disk I/O error"),
    the append, git's branch ref, the state file, the signing key's first write, the checkpoint. Each is
    named (exit 2, or the tick done with a warning), never an internal error; freed, the next tick goes on,
    the batch verifies and the signing key is whole."""
    root = small_disk / "repo"
    make_repository(root)
    batch_id = authorized(root)
    filler = fill(small_disk, leave_kib)
    tick = lanes(root, "tick", SLUG)
    said = tick.stdout + tick.stderr
    assert tick.returncode in (EXIT_OK, EXIT_REFUSED), said
    assert "Traceback" not in said and "internal error" not in said
    assert "a file being written" not in said  # every full write names its file
    if tick.returncode == EXIT_REFUSED:
        assert any(words in said for words in ("disk is full", "disk holding it is full", "No space left")), said
    filler.unlink()
    again = lanes(root, "tick", SLUG)
    assert again.returncode == EXIT_OK, again.stdout + again.stderr
    assert lanes(root, "verify", batch_id).returncode == EXIT_OK
    assert lanes(root, "key", "show").returncode == EXIT_OK


FILLING_EXECUTOR = """\
import os, pathlib, sys
marks = pathlib.Path(sys.argv[1])
if not (marks / "filled").exists():  # the first Executor fills the disk, then gives up without submitting
    (marks / "filled").write_text("")
    try:
        with open(sys.argv[2], "wb") as handle:
            while True:
                handle.write(b"\\0" * 65536)
                handle.flush()
    except OSError:
        pass
    sys.exit(1)
os.execv(sys.executable, [sys.executable, "-P", "-m", "lanes_es.cli.example_executor"])
"""


def test_the_autopilot_on_a_disk_that_fills_up_ends_with_a_named_cause_and_goes_on_once_freed(small_disk, tmp_path):
    """The lease given back at the end fails too on a full disk: that must not hide why the run ended (it was
    an internal error)."""
    from lanes_es.cli.demo import executor_hints

    root, marks = small_disk / "repo", tmp_path / "marks"
    make_repository(root)
    marks.mkdir()
    (tmp_path / "filling.py").write_text(FILLING_EXECUTOR)
    filler = small_disk / "filler"
    command = [LANES_ES, "--root", str(root), "run", SLUG, "--max-parallel", "1", "--lanes-dir",
               str(small_disk / "lanes"), "--executor", f"{sys.executable} -P {tmp_path / 'filling.py'} {marks} {filler}",
               "--yes", "--poll", "0.05"]
    env = {**os.environ, "LANES_ES_EXECUTOR_HINT": json.dumps(executor_hints())}
    first = subprocess.run(command, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    said = first.stdout + first.stderr
    assert (marks / "filled").exists() and filler.exists(), said
    assert first.returncode not in (EXIT_OK, 70) and "internal error" not in said and "Traceback" not in said, said
    filler.unlink()
    again = subprocess.run(command, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    assert again.returncode == EXIT_OK, again.stdout[-3000:] + again.stderr
    assert "completed: all enrollable children integrated" in again.stdout


# ---------------------------------------------------------------- concurrent commands, Ctrl-C during a tick


def test_concurrent_authorizations_leave_one_batch_and_say_so(repo):
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: lanes(repo, "authorize", SLUG, "--yes", "--max-parallel", "2"), range(4)))
    standing = json.loads(lanes(repo, "status", SLUG, "--json").stdout)["batch_id"]
    assert any(result.returncode == EXIT_OK for result in results)
    for result in results:
        if result.returncode == EXIT_OK:
            assert result.stdout.strip() == standing  # every id printed is the batch that stands
        else:
            refused(result, "confirmation_superseded", f"lanes-es authorize {SLUG}")


def slow_checks(repo: Path, marker: Path) -> None:
    """Every task's acceptance check sleeps 30 s first while `marker` exists, so a tick is still in QA when it
    is interrupted (and the next tick, the marker gone, is quick)."""
    for path in (repo / "docs" / "plans").glob("*.intent.json"):
        intent = json.loads(path.read_text())
        descriptor = json.loads(intent["acceptance"][0]["verification"])
        descriptor["command"]["argv"][1] = (f"import os, time; os.path.exists({str(marker)!r}) and time.sleep(30); "
                                            + descriptor["command"]["argv"][1])
        intent["acceptance"][0]["verification"] = json.dumps(descriptor)
        path.write_text(json.dumps(intent, indent=2) + "\n")
    subprocess.run(["git", "commit", "-qam", "slow checks"], cwd=repo, check=True)


def sleeping_checks(marker: Path) -> list[int]:
    """The pids of this test's slow checks now running (read from /proc: ps truncates long command lines)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and str(marker).encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


@pytest.mark.parametrize("whom", ["process_group", "tick_only"])
def test_ctrl_c_during_a_ticks_qa_exits_130_and_the_next_tick_goes_on(repo, tmp_path, store_url, whom):
    import signal
    import time

    marker = tmp_path / "slow"
    marker.write_text("")
    slow_checks(repo, marker)
    batch_id = authorized(repo)
    first = json.loads(lanes(repo, "tick", SLUG, "--json").stdout)
    handoff = next(h for h in first["handoffs"] if h["action"] == "provision")
    task, lane = handoff["task_id"], tmp_path / "lane"
    subprocess.run(["git", "worktree", "add", "-q", "-b", handoff["lane_branch"], str(lane), handoff["base_head"]],
                   cwd=repo, check=True)
    assert lanes(repo, "tick", SLUG, "--offer", f"{task}={lane}").returncode == EXIT_OK
    from lanes_es.cli.demo import TASKS

    (lane / TASKS[task][4]).parent.mkdir(parents=True, exist_ok=True)
    (lane / TASKS[task][4]).write_text(TASKS[task][5])
    assert lanes(lane, "task", "submit").returncode == EXIT_OK
    ticking = subprocess.Popen([LANES_ES, "tick", SLUG], cwd=repo, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 30
    while not sleeping_checks(marker):
        assert time.monotonic() < deadline and ticking.poll() is None, ticking.communicate()
        time.sleep(0.05)
    if whom == "process_group":
        os.killpg(ticking.pid, signal.SIGINT)
    else:
        ticking.send_signal(signal.SIGINT)
    out, err = ticking.communicate(timeout=20)  # well before the 30 s check could have ended
    assert ticking.returncode == 130, out + err
    assert err.strip() == ("lanes-es: interrupted; the log keeps every step already taken, run the command again "
                           "to go on")
    gone = time.monotonic() + 5
    while sleeping_checks(marker) and time.monotonic() < gone:
        time.sleep(0.05)
    assert sleeping_checks(marker) == []  # the check stopped with the tick
    assert lanes(repo, "verify", batch_id).returncode == EXIT_OK  # nothing half-written
    marker.unlink()
    again = lanes(repo, "tick", SLUG, "--json")
    assert again.returncode == EXIT_OK, again.stderr
    child = next(c for c in json.loads(again.stdout)["children"] if c["task_id"] == task)
    assert child["state"] in ("integrated", "released"), child  # the QA ran again and the Lane landed
