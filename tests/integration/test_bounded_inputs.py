"""Bounded reads and parsing: no file or argument a user can give reaches exit 70, and none is read without bound.

Each case runs the real command line (`python -m lanes_es.cli.main` in a subprocess) on a real repository
and store (both backends where a store is opened). Files that would be read whole are named as `/dev/zero`
(endless) or as sparse files of 4 GiB, and the command runs under an address-space limit of 1 GiB: a read
without bound fails there (MemoryError, exit 70, or the kernel's kill) where a bounded read refuses with
exit 2 and one line naming the file.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gitfixtures import run_git
from lanes_es.exit_codes import EXIT_FINDING, EXIT_OK, EXIT_REFUSED
from tests.integration.test_user_errors import (  # noqa: F401 - `repo` is a fixture of the user-error tests
    PROJECT, SLUG, authorized, refused, repo, rows,
)

pytestmark = pytest.mark.coordinator_worktree

ADDRESS_SPACE = 1 << 30  # enough for any command of lanes-es, far too little for a file read whole
DEEP_JSON = "[" * 60_000 + "]" * 60_000
HUGE = 4 << 30


def lanes(cwd: Path | str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`lanes-es ARGS` in `cwd`, in at most ADDRESS_SPACE of memory."""
    code = "import sys\nfrom lanes_es.cli.main import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, text=True, stdin=subprocess.DEVNULL,
                          capture_output=True, env={**os.environ, "PYTHONPATH": PROJECT, **(env or {})}, timeout=120,
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE)))


def sparse(path: Path, size: int = HUGE) -> Path:
    """A file of `size` bytes that takes no room (zeros read back)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:
        handle.truncate(size)
    return path


# ---------------------------------------------------------------- arguments


@pytest.mark.parametrize("option, name", [("--instruction", "lane_instruction"), ("--revision", "lane_revision")])
def test_json_arguments_nested_60000_deep_are_refused(repo, option, name):
    batch_id = authorized(repo)
    before = rows(repo)
    line = refused(lanes(repo, "tick", SLUG, option, DEEP_JSON), f"invalid {name}", "nests too deeply")
    assert len(line.splitlines()) == 1
    assert rows(repo) == before, batch_id


STATUS, AUTHORIZE = ["status", SLUG], ["authorize", SLUG, "--yes", "--max-parallel", "1"]


@pytest.mark.parametrize("url, words, command", [
    ("postgresql://[::1", ["invalid store URL", "Invalid IPv6 URL"], STATUS),
    ("postgresql://[::1", ["invalid store URL", "Invalid IPv6 URL"], AUTHORIZE),  # a writer checks the place first
    ("postgresql://user:secret@localhost:99999/db", ["invalid store URL", "Port out of range", "user:***@"], AUTHORIZE),
    ("postgresql://user@localhost:abc/db", ["invalid store URL", "could not be cast to integer"], STATUS),
    ("postgresql://postgres@127.0.0.1:5432/test?schema=a;b", ["invalid store URL", "schema 'a;b'"], AUTHORIZE),
    ('postgresql://postgres@127.0.0.1:5432/test?schema=x"y', ["invalid store URL", "not a plain PostgreSQL name"],
     STATUS),
])
def test_a_store_url_that_cannot_be_read_is_refused_in_one_line(plain_repo, url, words, command):
    result = lanes(plain_repo, "--store", url, *command)
    line = refused(result, *words)
    assert "secret" not in result.stderr and "LINE 1" not in result.stderr and len(line.splitlines()) == 1
    assert not (plain_repo / ".git" / "lanes-es" / "events.sqlite").exists()


# ---------------------------------------------------------------- files a user names


@pytest.fixture
def proof(demo, tmp_path) -> tuple[Path, Path, str]:
    """An inclusion proof of the session's demo batch (on this test's backend) and its public key file."""
    repo, batch_id = demo
    proof_file, key_file = tmp_path / "proof.json", tmp_path / "key.pub"
    result = lanes(repo, "prove", batch_id, "--event", "3", "-o", str(proof_file))
    assert result.returncode == EXIT_OK, result.stderr
    shown = lanes(repo, "key", "show")
    assert shown.returncode == EXIT_OK, shown.stderr
    key_file.write_text(shown.stdout)
    return proof_file, key_file, batch_id


def test_verify_export_of_dev_zero_is_refused_at_its_first_line(demo, tmp_path):
    line = refused(lanes(demo[0], "verify", "--export", "/dev/zero"), "/dev/zero line 1", "longer than 16 MiB")
    assert "not an export" in line


def test_verify_export_of_a_sparse_file_of_4_gib_is_its_finding(demo, tmp_path):
    """A file that is there but is no export is what verify is for: its finding (exit 1), read a line at a time."""
    result = lanes(demo[0], "verify", "--export", str(sparse(tmp_path / "huge.jsonl")))
    assert result.returncode == EXIT_FINDING, result.stderr
    assert "line 1 is longer than 16 MiB" in result.stdout and "internal error" not in result.stderr


def test_verify_proof_of_dev_zero_is_refused(proof):
    _, key, _ = proof
    refused(lanes(".", "verify-proof", "/dev/zero", "--public-key", str(key)), "input_too_large", "/dev/zero",
            "16 MiB")


def test_a_checkpoint_of_dev_zero_is_refused_by_verify_proof_and_verify(proof, demo):
    proof_file, key, batch_id = proof
    refused(lanes(".", "verify-proof", str(proof_file), "--public-key", str(key), "--checkpoint", "/dev/zero"),
            "input_too_large", "/dev/zero", "64 KiB")
    refused(lanes(demo[0], "verify", batch_id, "--checkpoint", "/dev/zero"), "input_too_large", "64 KiB")


def test_a_public_key_of_dev_zero_is_refused(proof, demo):
    proof_file, _, batch_id = proof
    refused(lanes(".", "verify-proof", str(proof_file), "--public-key", "/dev/zero"), "invalid_public_key",
            "/dev/zero", "64 KiB")
    refused(lanes(demo[0], "verify", batch_id, env={"LANES_ES_PUBLIC_KEY": "/dev/zero"}), "invalid_public_key")


def test_a_signing_key_of_dev_zero_is_refused(plain_repo):
    refused(lanes(plain_repo, "key", "show", env={"LANES_ES_SIGNING_KEY": "/dev/zero"}), "/dev/zero",
            "not a signing key")


def test_an_intent_file_of_4_gib_is_refused(plain_repo, tmp_path):
    huge = sparse(tmp_path / "huge.intent.json")
    refused(lanes(plain_repo, "intent", "overlap", str(huge), str(huge)), "invalid intent", "larger than 64 KiB")


# ---------------------------------------------------------------- files of the repository


def test_an_initiative_of_4_gib_is_refused_by_plan_and_authorize(repo, monkeypatch):
    monkeypatch.setenv("LANES_ES_COORDINATOR", ".")  # the file is the checkout's own, not committed
    sparse(repo / "docs" / "initiatives" / "huge.md")
    refused(lanes(repo, "plan", "huge"), "docs/initiatives/huge.md", "larger than 1048576 bytes")
    before = rows(repo)
    refused(lanes(repo, "authorize", "huge", "--yes", "--max-parallel", "1"), "larger than 1048576 bytes")
    assert rows(repo) == before


def test_a_repository_id_of_4_gib_is_refused_as_edited(repo):
    authorized(repo)
    sparse(repo / ".git" / "lanes-es" / "repository-id")
    refused(lanes(repo, "status", SLUG), "repository-id", "not 32 hex digits")


def test_a_lanes_git_file_of_4_gib_is_not_read_whole(plain_repo, tmp_path):
    """A Lane's `.git` file is read from disk (no spawn) by the Executor's `task` commands; one that is no `.git`
    file (an Executor may rewrite it) leaves the question to git, which refuses it."""
    lane = tmp_path / "lane"
    run_git(plain_repo, "worktree", "add", "-q", "-b", "some-lane", str(lane))
    (lane / ".git").unlink()
    sparse(lane / ".git")
    result = lanes(lane, "task", "status")
    assert result.returncode == EXIT_REFUSED, result.stderr
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr
