"""Real git repositories, Lanes and intents for tests (tests/SCENARIOS.md, REAL-GIT and REAL-WT).

The usual layout, as upstream's tests build it:

    root = make_repo(tmp_path / "repo", intents={"task-a": intent_json("task-a", ["a.txt"])})
    batch_head = checkout_batch_branch(root, "initiative-slug")     # coordinator on imm/<slug>
    lane = add_lane(root, "initiative-slug", "task-a", tmp_path / "lanes")
    write_file(lane, "a.txt", "a\\n"); lane_commit = commit_all(lane, "imm(task-a): deliver", batch_id="batch-001")

Fixture git runs through `subprocess`, not through `lanes_es.adapters.git`, on purpose: a
fixture must not depend on the runner under test, and its spawns must not count in
`lanes_es.adapters.git.STATS` (tests assert spawn counts of the adapters).

Every function takes and returns plain paths and commit ids (str), so any test can use it.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any, Iterable, Mapping

BASE_FILE = "base.txt"
DEFAULT_GITIGNORE = ".imm/state/\n"
DESCRIPTOR_CONTRACT = "assurance_kernel/verification_descriptor/v2"
INTENT_CONTRACT = "assurance_kernel/task_intent/v1"
BATCH_TRAILER = "Immune-Brain-Batch"
BATCH_AUTHOR_NAME = "Immune-Brain Batch"
BATCH_AUTHOR_EMAIL = "immune-brain@local"

PathLike = str | os.PathLike[str]


# ---------------------------------------------------------------- plain git


def run_git(cwd: PathLike, *args: str, input: bytes | str | None = None, env: Mapping[str, str] | None = None,
            check: bool = True) -> subprocess.CompletedProcess[bytes]:
    """Run `git -C cwd <args>` with hooks and auto maintenance off (a fixture's commit starts no second git);
    raise with git's words when `check` and it fails."""
    full_env = {**os.environ, "GIT_PAGER": "cat", "GIT_TERMINAL_PROMPT": "0", **(env or {})}
    data = input.encode() if isinstance(input, str) else input
    argv = ["git", "-C", str(cwd), "-c", "core.hooksPath=/dev/null", "-c", "maintenance.auto=false", *args]
    result = subprocess.run(argv, input=data, capture_output=True, env=full_env)
    if check and result.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed ({result.returncode}): {result.stderr.decode().strip()}")
    return result


def git_out(cwd: PathLike, *args: str) -> str:
    """stdout of a git command, trailing newline stripped."""
    return run_git(cwd, *args).stdout.decode().rstrip("\n")


def head(cwd: PathLike) -> str:
    return git_out(cwd, "rev-parse", "HEAD")


def current_branch(cwd: PathLike) -> str | None:
    result = run_git(cwd, "symbolic-ref", "--quiet", "--short", "HEAD", check=False)
    return result.stdout.decode().strip() or None


def rev(cwd: PathLike, revision: str) -> str:
    return git_out(cwd, "rev-parse", "--verify", f"{revision}^{{commit}}")


def all_refs(cwd: PathLike) -> str:
    """Every ref with its target: compare before and after to prove nothing moved."""
    return git_out(cwd, "for-each-ref", "--format=%(refname) %(objectname)")


def porcelain(cwd: PathLike) -> str:
    """The worktree status as upstream's cleanliness check reads it (empty = clean)."""
    return git_out(cwd, "status", "--porcelain", "--untracked-files=all", "--ignore-submodules=none")


def subjects(cwd: PathLike, revision_range: str) -> list[str]:
    text = git_out(cwd, "log", "--format=%s", revision_range)
    return text.splitlines() if text else []


def trailer(cwd: PathLike, commit: str) -> str:
    return git_out(cwd, "log", "-n", "1", f"--format=%(trailers:key={BATCH_TRAILER},valueonly)", commit).strip()


# ---------------------------------------------------------------- files and commits


def write_file(root: PathLike, relative: str, content: str | bytes, *, mode: int | None = None) -> str:
    """Write `root/relative` (parents created); returns the absolute path."""
    path = Path(root) / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, str):
        path.write_text(content, encoding="utf-8")
    else:
        path.write_bytes(content)
    if mode is not None:
        path.chmod(mode)
    return str(path)


def batch_message(task_id: str, batch_id: str, subject_rest: str = "deliver") -> str:
    """A lane commit message as upstream writes it: subject, blank line, batch trailer."""
    return f"imm({task_id}): {subject_rest}\n\n{BATCH_TRAILER}: {batch_id}\n"


def commit_all(cwd: PathLike, message: str, *, batch_identity: bool = True, paths: Iterable[str] | None = None,
               allow_empty: bool = False) -> str:
    """Stage everything (or `paths`) and commit with `message`; returns the new HEAD.

    With `batch_identity` the author and committer are upstream's batch identity, as a lane
    commit made by the runner would have them.
    """
    run_git(cwd, "add", "-A", "--", *(paths or ["."]))
    env = identity_env() if batch_identity else None
    run_git(cwd, "commit", "-q", "--no-verify", *(["--allow-empty"] if allow_empty else []), "-F", "-",
            input=message, env=env)
    return head(cwd)


def commit_file(cwd: PathLike, relative: str, content: str | bytes, message: str | None = None, *,
                batch_identity: bool = False) -> str:
    """Write one file and commit only it; returns the new HEAD."""
    write_file(cwd, relative, content)
    return commit_all(cwd, message or f"add {relative}", batch_identity=batch_identity, paths=[relative])


def identity_env() -> dict[str, str]:
    return {"GIT_AUTHOR_NAME": BATCH_AUTHOR_NAME, "GIT_AUTHOR_EMAIL": BATCH_AUTHOR_EMAIL,
            "GIT_COMMITTER_NAME": BATCH_AUTHOR_NAME, "GIT_COMMITTER_EMAIL": BATCH_AUTHOR_EMAIL}


# ---------------------------------------------------------------- intents and descriptors


def descriptor(argv: list[str], *, executable: str = "python3", cwd: str = ".", timeout_ms: int = 60000,
               max_output_bytes: int = 4096) -> str:
    """A verification descriptor v2 as the JSON text an acceptance item's `verification` holds.

    Descriptors run without a shell: give the executable and its argv, for example
    `descriptor(["-c", "import sys; sys.exit(0)"])`.
    """
    return json.dumps({
        "contract": DESCRIPTOR_CONTRACT,
        "command": {"executable": executable, "argv": argv, "cwd": cwd, "timeout_ms": timeout_ms,
                    "max_output_bytes": max_output_bytes},
        "environment": {"prepare": None, "writable_paths": []},
    })


def passing_descriptor() -> str:
    """Always passes."""
    return descriptor(["-c", "import sys; sys.exit(0)"])


def fails_if_exists(path: str) -> str:
    """Fails when `path` exists in the tree it runs on (a sibling that breaks the child)."""
    return descriptor(["-c", f"import os,sys; sys.exit(1 if os.path.exists({path!r}) else 0)"])


def requires_file(path: str) -> str:
    """Fails unless `path` exists in the tree it runs on (a delivery that never came)."""
    return descriptor(["-c", f"import os,sys; sys.exit(0 if os.path.exists({path!r}) else 1)"])


def intent_json(task_id: str, scope_hint: list[str] | None = None, *, verification: str | None = None,
                acceptance: list[dict[str, str]] | None = None, goal: str | None = None, risk: str = "routine",
                revision: int = 1) -> dict[str, Any]:
    """A TaskIntent v1 document; by default one acceptance item `A1` that always passes, scope `[<task>.txt]`."""
    return {
        "contract": INTENT_CONTRACT,
        "task_id": task_id,
        "goal": goal if goal is not None else f"Deliver {task_id}",
        "acceptance": acceptance if acceptance is not None else [
            {"id": "A1", "assertion": f"{task_id} holds", "verification": verification or passing_descriptor()}],
        "scope_hint": scope_hint if scope_hint is not None else [f"{task_id}.txt"],
        "risk": risk,
        "revision": revision,
        "owner": "user",
    }


def intent_path(task_id: str, *, archived: bool = False) -> str:
    return f"docs/plans/{'archive/' if archived else ''}{task_id}.intent.json"


def write_intent(root: PathLike, intent: Mapping[str, Any], *, archived: bool = False) -> str:
    """Write an intent as 2-space JSON plus a newline at its sidecar path; returns the relative path."""
    relative = intent_path(str(intent["task_id"]), archived=archived)
    write_file(root, relative, json.dumps(intent, indent=2) + "\n")
    return relative


# ---------------------------------------------------------------- repositories and Lanes


def make_repo(path: PathLike, *, intents: Mapping[str, Mapping[str, Any]] | None = None,
              files: Mapping[str, str] | None = None, gitignore: str = DEFAULT_GITIGNORE) -> str:
    """`git init -b main` with user config, `.gitignore`, `base.txt` = `base\\n`, the intents and files,
    committed as `base`. Returns the repository's real path; its HEAD is the base commit."""
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    run_git(root, "init", "-q", "-b", "main")
    run_git(root, "config", "user.name", "Test User")
    run_git(root, "config", "user.email", "test@example.invalid")
    run_git(root, "config", "commit.gpgsign", "false")
    write_file(root, ".gitignore", gitignore)
    write_file(root, BASE_FILE, "base\n")
    for intent in (intents or {}).values():
        write_intent(root, intent)
    for relative, content in (files or {}).items():
        write_file(root, relative, content)
    commit_all(root, "base", batch_identity=False)
    return os.path.realpath(root)


def checkout_batch_branch(root: PathLike, initiative_slug: str = "initiative-slug") -> str:
    """Put the coordinator on `imm/<slug>` at its HEAD; returns that head (the batch head)."""
    run_git(root, "checkout", "-q", "-b", f"imm/{initiative_slug}")
    return head(root)


def coordinator(root: PathLike, initiative_slug: str = "initiative-slug") -> Path:
    """The coordinator worktree a batch of `initiative_slug` runs in by default (tests marked
    `coordinator_worktree`): lanes-es's place under the repository's git dir, not the user's checkout."""
    return Path(root, ".git", "lanes-es", "coordinators", initiative_slug)


def batch_state_files(root: PathLike, initiative_slug: str = "initiative-slug") -> list[Path]:
    """The batch records (`.imm/state/batches/<id>.json`, no reports) in the default coordinator worktree."""
    folder = coordinator(root, initiative_slug) / ".imm" / "state" / "batches"
    return sorted(path for path in folder.glob("*.json") if ".report" not in path.name)


def lane_branch(initiative_slug: str, task_id: str) -> str:
    return f"imm-lane/{initiative_slug}/{task_id}"


def add_lane(root: PathLike, initiative_slug: str, task_id: str, parent_dir: PathLike, *,
             base: str = "HEAD", branch: str | None = None) -> str:
    """`git worktree add -b imm-lane/<slug>/<task> <parent_dir>/lane-<task> <base>`, as a Lane Steward
    would; returns the Lane's real path."""
    Path(parent_dir).mkdir(parents=True, exist_ok=True)
    lane = Path(parent_dir) / f"lane-{task_id}"
    run_git(root, "worktree", "add", "-q", "-b", branch or lane_branch(initiative_slug, task_id), str(lane), base)
    return os.path.realpath(lane)


def remove_lane(root: PathLike, lane: PathLike) -> None:
    """`git worktree remove` (the steward's release)."""
    run_git(root, "worktree", "remove", str(lane))


# ---------------------------------------------------------------- audit pair


def audit_pair_paths(task_id: str, run_id: str = "run-1") -> tuple[str, str]:
    directory = f".imm/audit/{task_id}/{run_id}"
    return f"{directory}/task-record.json", f"{directory}/terminal-proof.json"


def task_record(task_id: str, run_id: str = "run-1", *, lifecycle: str = "done",
                at: str = "2026-01-01T00:00:00.000Z", goal: str | None = None,
                scope_hint: list[str] | None = None) -> dict[str, Any]:
    """A minimal done task record whose last history event is the completion (docs/upstream.md#the-audit-pair)."""
    return {
        "contract": "assurance_kernel/task_record/v4",
        "task_id": task_id,
        "run_id": run_id,
        "lifecycle": lifecycle,
        "artifact_state": "frozen",
        "intent_snapshot": {"goal": goal or f"Deliver {task_id}", "scope_hint": scope_hint or [f"{task_id}.txt"]},
        "history": [{"type": "complete", "from_state": "active:frozen", "to_state": f"{lifecycle}:frozen", "at": at}],
    }


def write_audit_pair(lane: PathLike, task_id: str, run_id: str = "run-1", *, lifecycle: str = "done",
                     record: Mapping[str, Any] | None = None, at: str = "2026-01-01T00:00:00.000Z",
                     proof_overrides: Mapping[str, Any] | None = None) -> tuple[str, str]:
    """Write `.imm/audit/<task>/<run>/{task-record,terminal-proof}.json` into `lane`, the proof's
    `final_record_hash` being the sha256 of the record bytes; returns the two relative paths."""
    record_path, proof_path = audit_pair_paths(task_id, run_id)
    document = dict(record) if record is not None else task_record(task_id, run_id, lifecycle=lifecycle, at=at)
    record_bytes = (json.dumps(document, indent=2) + "\n").encode()
    proof = {
        "contract": "assurance_kernel/task_tombstone/v2",
        "task_id": task_id,
        "lifecycle_status": "terminal",
        "terminal_lifecycle": lifecycle,
        "terminal_event_id": f"complete:{task_id}:{at}",
        "final_record_hash": "sha256:" + hashlib.sha256(record_bytes).hexdigest(),
        "terminalized_at": at,
        **(proof_overrides or {}),
    }
    write_file(lane, record_path, record_bytes)
    write_file(lane, proof_path, json.dumps(proof, indent=2) + "\n")
    return record_path, proof_path
