"""`GitBatch`: the BatchGit port on real git (docs/upstream.md#the-batch-branch-preflight, #the-lane-commit, #finding-a-lane-commit-again, #taskintent-v1).

The batch-branch preflight at the coordinator, the lane commit in a Lane (and the lookup
that adopts one a crash left behind), and the reading of a TaskIntent sidecar.

One deviation from upstream: the lane commit does not read the settled run from a kernel
SQLite store; the tick passes it as a `SettledEvidence` (the kernel port reads it), and
the audit pair it names is verified here from the Lane's files.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from datetime import datetime, timezone
from typing import Any

import msgspec

from lanes_es.adapters.delivery import tree_delivery
from lanes_es.adapters.git import DEFAULT_AUTHOR_NAME, batch_identity_env, git, git_ok
from lanes_es.adapters.lane_git import (
    BATCH_TRAILER,
    STATUS_ARGS,
    branch_and_head,
    lineage_broken,
    parse_status_v2,
    read_status,
    real_path,
)
from lanes_es.domain.audit_pair import audit_paths, verify_pair
from lanes_es.domain.delivery import DELIVERY_DRIFTED
from lanes_es.domain.ids import batch_branch_name, format_timestamp, is_valid_id
from lanes_es.domain.intent import canonical_intent_hash, is_path_allowed_for_child, parse_task_intent
from lanes_es.domain.jstext import parse_json, parse_json_file_text
from lanes_es.ports import IntentRead, PortError, PreflightResult

COMMIT_EVIDENCE_CONTRACT = "assurance_kernel/batch_commit_evidence/v1"
COMMIT_INTENT_CONTRACT = "lanes_es/lane_commit_intent/v1"  # ours: written before the commit, removed after
COMMIT_EVIDENCE_DIR = ".imm/state/batches/commits"
HIDING_INDEX_FLAGS = ("h", "S", "s")  # assume-unchanged, skip-worktree: changes git status would not show
MAX_INTENT_BYTES = 64 * 1024
MAX_EVIDENCE_BYTES = 64 * 1024
PLANS_DIR = "docs/plans"
# One lookup record: commit, parents, batch trailer, author name, author email, subject.
LOOKUP_FORMAT = f"%H%x00%P%x00%(trailers:key={BATCH_TRAILER},valueonly)%x00%an%x00%ae%x00%s"
LOOKUP_DEPTH = "20"


class SettledEvidence(msgspec.Struct, frozen=True, kw_only=True):
    """What the kernel knows of a child's settled run, for the lane commit (upstream's settled evidence).

    `record_path` and `proof_path` are the Lane-relative paths of the audit pair,
    `.imm/audit/<task>/<run>/task-record.json` and `terminal-proof.json`.
    """

    task_id: str
    run_id: str
    lifecycle: str
    goal: str
    scope_hint: list[str]
    record_path: str
    proof_path: str
    delivery_identity: str | None = None  # what the passing QA reviewed (lanes_es/domain/delivery.py)


class LookupRecord(msgspec.Struct, frozen=True):
    commit: str
    parents: list[str]
    trailer: str
    author_name: str
    author_email: str
    subject: str


class GitBatch:
    """BatchGit on real git. One instance per tick: it caches the tracked intent sidecars per root."""

    def __init__(self) -> None:
        self._tracked_plans: dict[str, set[str]] = {}

    # ------------------------------------------------------------ preflight (docs/upstream.md#the-batch-branch-preflight)

    def preflight(self, root: str, initiative_slug: str, base_head: str, *,
                  reuse_head: str | None = None, create: bool = True) -> PreflightResult:
        """Check the coordinator checkout, then create `imm/<slug>` at `base_head` (or reuse it); with `create`
        false, only check (before a confirmation is recorded: what would refuse the batch refuses it now).

        Three reads stand for upstream's five: one rev-parse (toplevel and whether the
        branch exists), the index flags, and one porcelain v2 status (dirt, HEAD, branch).
        """
        branch = batch_branch_name(initiative_slug)
        if not is_valid_id(initiative_slug):
            return _refused("branch_creation_failed", f"initiative slug {initiative_slug!r} cannot name a branch")
        probe = git_ok(root, "rev-parse", "--show-toplevel", "--verify", "--quiet", f"refs/heads/{branch}")
        lines = probe.text.split("\n") if probe.exit_code in (0, 1) and probe.text else []
        if not lines:
            return _refused("not_a_git_repository", f"{root} is not inside a git working tree")
        if real_path(lines[0]) != real_path(root):
            return _refused("not_repository_root", f"{root} is not the repository root {lines[0]}")
        hidden = _hidden_by_index_flags(root)
        if hidden:
            return _refused("dirty_working_tree", f"unsupported index flags (assume-unchanged or skip-worktree) on "
                                                  f"{_listed(hidden)}")
        status = git_ok(root, *STATUS_ARGS)
        if status.exit_code != 0:
            return _refused("dirty_working_tree", f"git status failed: {status.error_text}")
        read = parse_status_v2(status.stdout)
        if read.entries:
            return _refused("dirty_working_tree", f"the working tree has uncommitted changes: "
                                                  f"{_listed([path for _, path in read.entries])}")
        if read.head is None:
            return _refused("uncommitted_head", "HEAD does not name a commit yet")
        if probe.exit_code == 0:
            return self._reuse_branch(root, branch, base_head, reuse_head, read.branch, read.head)
        if not create:
            return PreflightResult(ok=True, branch=branch)
        return self._create_branch(root, branch, base_head, read.branch, read.head)

    @staticmethod
    def _reuse_branch(root: str, branch: str, base_head: str, reuse_head: str | None, current_branch: str | None,
                      head: str) -> PreflightResult:
        """An existing batch branch is reused only by the next batch of a settled one, checked out at base_head."""
        exists = f"batch branch {branch} already exists"
        if reuse_head is None:
            return _refused("batch_branch_exists", exists)
        if current_branch != branch:
            return _refused("batch_branch_exists", f"{exists} and is not checked out (current: "
                                                   f"{current_branch or 'detached HEAD'})")
        if head != base_head:
            return _refused("batch_branch_exists", f"{exists} at {head}, not at base_head {base_head}")
        if reuse_head != base_head and git_ok(root, "merge-base", "--is-ancestor", reuse_head,
                                              base_head).exit_code != 0:
            return _refused("batch_branch_exists", f"{exists} and base_head {base_head} does not descend from the "
                                                   f"settled batch head {reuse_head}")
        return PreflightResult(ok=True, branch=branch)

    @staticmethod
    def _create_branch(root: str, branch: str, base_head: str, original_branch: str | None,
                       original_head: str) -> PreflightResult:
        created = git_ok(root, "checkout", "-q", "-b", branch, base_head, env=batch_identity_env())
        if created.exit_code == 0:
            return PreflightResult(ok=True, branch=branch)
        # Put HEAD back where it was if the failed checkout moved it; the branch is never deleted.
        now_branch, now_head = branch_and_head(root)
        if (now_branch, now_head) != (original_branch, original_head):
            git_ok(root, "checkout", "-q", original_branch or original_head)
        reason = "batch_branch_exists" if "already exists" in created.error_text else "branch_creation_failed"
        return _refused(reason, f"git checkout -b {branch} {base_head} failed: {created.error_text}")

    # ------------------------------------------------------------ lane commit (docs/upstream.md#the-lane-commit)

    def commit_child(self, lane_path: str, task_id: str, batch_id: str, expected_head: str, branch: str,
                     evidence: SettledEvidence | None) -> str:
        """Commit the settled child's delivery and audit pair on its Lane branch; returns the lane commit.

        Spawns: status, index flags, add (when something is unstaged), commit, and one
        diff-tree that reads the new commit's parents and paths back.
        """
        _require_batch_id(batch_id)
        settled = _settled(lane_path, task_id, evidence)
        status = read_status(lane_path)
        if status.branch != branch:
            raise PortError(lineage_broken(f"current branch {status.branch or '(detached)'} does not match expected "
                                           f"branch {branch}"))
        if status.head != expected_head:
            raise PortError(lineage_broken(f"current HEAD {status.head} does not match expected_head "
                                           f"{expected_head}"))
        hidden = _hidden_by_index_flags(lane_path)
        if hidden:
            raise PortError(f"dirty_outside_scope: index flags hide changes to {_listed(hidden)}")
        paths = [path for _, path in status.entries]
        _require_in_scope(paths, task_id, settled.scope_hint)
        if status.dirty_submodules:
            raise PortError("residual unstaged changes cannot be captured by the parent repository: "
                            f"{_listed(status.dirty_submodules)}")
        unstaged = [path for code, path in status.entries if code == "??" or code[1] != " "]
        if unstaged:  # paths on stdin: no argv limit, and taken literally
            git(lane_path, "--literal-pathspecs", "add", "-A", "--pathspec-from-file=-", "--pathspec-file-nul",
                stdin="\0".join(unstaged).encode("utf-8", "surrogateescape"))
        # Durable before the commit: the tree about to be committed, so that a crash before the
        # evidence file below still leaves proof that the commit is this runner's (see the lookup).
        tree = git(lane_path, "write-tree").text
        _require_reviewed_delivery(lane_path, expected_head, tree, settled)
        _write_state_document(lane_path, _intent_path(batch_id, task_id), {
            "contract": COMMIT_INTENT_CONTRACT, "batch_id": batch_id, "task_id": task_id, "tree": tree,
            "parent_head": expected_head})
        message = commit_message(task_id, settled.goal, batch_id)
        committed = git_ok(lane_path, "commit", "--no-verify", "--quiet", "-F", "-", stdin=message,
                           env=batch_identity_env())
        if committed.exit_code != 0:
            raise PortError(f"commit_failed: {committed.error_text or committed.text or 'git commit failed'}")
        commit = self._verify_new_commit(lane_path, task_id, expected_head, settled.scope_hint)
        try:
            _write_commit_evidence(lane_path, batch_id, task_id, commit, expected_head)
        except OSError as error:
            raise PortError(f"commit_failed: lane commit {commit} made but its evidence was not written: "
                            f"{error.strerror or error}") from None
        return commit

    @staticmethod
    def _verify_new_commit(lane_path: str, task_id: str, expected_head: str, scope_hint: list[str]) -> str:
        """HEAD moved, onto exactly the expected parent, and its change stays within scope."""
        out = git(lane_path, "diff-tree", "-r", "-z", "--no-renames", "--name-only", "--always", "--format=%H %P",
                  "HEAD").stdout.decode("utf-8", "surrogateescape")
        header, _, rest = out.partition("\0")
        commit, *parents = header.split(" ")
        if commit == expected_head:
            raise PortError("commit_failed: HEAD did not move")
        if parents != [expected_head]:
            raise PortError(lineage_broken(f"commit parent {' '.join(parents)} does not match expected_head "
                                           f"{expected_head}"))
        changed = [path for path in rest.removeprefix("\n").split("\0") if path]
        _require_in_scope(changed, task_id, scope_hint)
        return commit

    # ------------------------------------------------------------ lookup (docs/upstream.md#finding-a-lane-commit-again)

    def lookup_batch_commit(self, lane_path: str, task_id: str, batch_id: str, expected_head: str, branch: str,
                            evidence: SettledEvidence | None) -> str | None:
        """The lane commit an earlier tick made for this child and batch, verified; None when there is none.

        The commit must be backed by the evidence file the commit wrote; a commit that
        claims the batch without it is a forgery and breaks the lineage. In a Lane nothing
        may follow the lane commit, so HEAD must be that commit (LANE-LCM-15).
        """
        _require_batch_id(batch_id)
        recorded = _read_commit_evidence(lane_path, batch_id, task_id)
        if recorded is not None:
            listed = git_ok(lane_path, "log", "-n", "1", f"--format={LOOKUP_FORMAT}", recorded, "--")
            records = _lookup_records(listed.stdout) if listed.exit_code == 0 else []
        else:
            listed = git_ok(lane_path, "log", "--fixed-strings", f"--grep=imm({task_id}):", "-n", LOOKUP_DEPTH,
                            f"--format=%x1e{LOOKUP_FORMAT}")
            records = _lookup_records(listed.stdout) if listed.exit_code == 0 else []
        match = next((record for record in records if record.trailer.strip() == batch_id
                      and record.subject.startswith(f"imm({task_id}):")), None)
        if match is None:
            return None
        authority = os.environ.get("GIT_AUTHOR_NAME") or DEFAULT_AUTHOR_NAME
        recovered = recorded != match.commit and _was_about_to_commit(lane_path, batch_id, task_id, match,
                                                                      expected_head)
        if recorded != match.commit and not recovered:
            raise PortError(lineage_broken(f"commit {match.commit} lacks durable batch runner production evidence"))
        if match.author_name and match.author_name != authority:
            raise PortError(lineage_broken(f"adopted commit author {match.author_name} does not match batch "
                                           f"authority {authority}"))
        settled = _settled(lane_path, task_id, evidence)
        self._verify_existing_commit(lane_path, task_id, match, expected_head, branch, settled.scope_hint)
        if recovered:
            # A crash fell between the commit and its evidence file; the intent written before the
            # commit names exactly this tree on this parent, so the commit is this runner's own.
            _write_commit_evidence(lane_path, batch_id, task_id, match.commit, expected_head)
        return match.commit

    @staticmethod
    def _verify_existing_commit(lane_path: str, task_id: str, match: LookupRecord, expected_head: str, branch: str,
                                scope_hint: list[str]) -> None:
        current_branch, head = branch_and_head(lane_path)
        if current_branch != branch:
            raise PortError(lineage_broken(f"current branch {current_branch or '(detached)'} does not match "
                                           f"expected branch {branch}"))
        if head != match.commit:
            raise PortError(lineage_broken(f"current HEAD {head} does not match lane commit {match.commit}"))
        if match.parents != [expected_head]:
            raise PortError(lineage_broken(f"commit parent {' '.join(match.parents)} does not match expected_head "
                                           f"{expected_head}"))
        changed = git(lane_path, "diff-tree", "-r", "-z", "--no-renames", "--name-only", expected_head,
                      match.commit).stdout.decode("utf-8", "surrogateescape")
        _require_in_scope([path for path in changed.split("\0") if path], task_id, scope_hint)

    # ------------------------------------------------------------ TaskIntent (docs/upstream.md#taskintent-v1)

    def read_intent(self, root: str, task_id: str, intent_path: str | None) -> IntentRead:
        """readTaskIntent: a tracked, regular sidecar reached without symlinks, at most 64 KiB, parsed."""
        if not is_valid_id(task_id):
            raise PortError(f"invalid: task id {task_id!r} is not a valid task id")
        active, archived = f"{PLANS_DIR}/{task_id}.intent.json", f"{PLANS_DIR}/archive/{task_id}.intent.json"
        if intent_path is not None and intent_path not in (active, archived):
            raise PortError(f"invalid: intent path {intent_path} of {task_id} must be {active} or {archived}")
        tracked = self._tracked(root, [active, archived] if intent_path is None else [intent_path])
        path = intent_path if intent_path is not None else (active if active in tracked else archived)
        if path not in tracked:
            raise PortError(f"missing: TaskIntent {path} is not tracked")
        data = _read_plain_file(root, path, MAX_INTENT_BYTES)
        try:
            intent = parse_task_intent(parse_json_file_text(data))
        except ValueError as error:  # InvalidIntent is a ValueError
            raise PortError(f"invalid: TaskIntent {path}: {error}") from None
        if intent["task_id"] != task_id:
            raise PortError(f"invalid: TaskIntent {path} names task {intent['task_id']}, not {task_id}")
        return IntentRead(intent=intent, content_hash=canonical_intent_hash(intent), path=path)

    def _tracked(self, root: str, wanted: list[str]) -> set[str]:
        """Tracked paths under docs/plans: one ls-files per root for this instance, listed again only
        when none of `wanted` is in the list (an integration may have brought it since)."""
        known = self._tracked_plans.get(root, set())
        if root not in self._tracked_plans or not any(path in known for path in wanted):
            listed = git_ok(root, "ls-files", "-z", "--full-name", "--", PLANS_DIR)
            if listed.exit_code != 0:
                raise PortError(f"missing: cannot list tracked intents at {root}: {listed.error_text}")
            names = listed.stdout.decode("utf-8", "surrogateescape").split("\0")
            self._tracked_plans[root] = {name for name in names if name}
        return self._tracked_plans[root]


# ---------------------------------------------------------------- helpers: messages and checks


def commit_message(task_id: str, goal: str, batch_id: str) -> str:
    """`imm(<task>): <first line of goal, trimmed, or the task id>`, a blank line, the batch trailer."""
    subject = goal.split("\n", 1)[0].strip() or task_id
    return f"imm({task_id}): {subject}\n\n{BATCH_TRAILER}: {batch_id}\n"


def _refused(reason: str, message: str) -> PreflightResult:
    return PreflightResult(ok=False, reason=reason, message=message)


def _listed(paths: list[str], limit: int = 5) -> str:
    shown = ", ".join(paths[:limit])
    return shown + (f" and {len(paths) - limit} more" if len(paths) > limit else "")


def _require_reviewed_delivery(lane_path: str, expected_head: str, tree: str, settled: SettledEvidence) -> None:
    """docs/upstream.md#the-lane-commit: the tree about to be committed carries the change QA reviewed, nothing else."""
    if settled.delivery_identity is None:
        return  # a run settled before the identity was kept: nothing to compare with
    if tree_delivery(lane_path, expected_head, tree, settled.task_id, settled.scope_hint) != settled.delivery_identity:
        git(lane_path, "reset", "--quiet")  # unstage what this commit staged; the files stay as they are
        raise PortError(DELIVERY_DRIFTED)


def _require_batch_id(batch_id: str) -> None:
    if not is_valid_id(batch_id):
        raise PortError(f"commit_failed: batch id {batch_id!r} is not a safe file identity")


def _require_in_scope(paths: list[str], task_id: str, scope_hint: list[str]) -> None:
    outside = [path for path in paths if not is_path_allowed_for_child(path, task_id, scope_hint)]
    if outside:
        raise PortError(f"dirty_outside_scope: {_listed(outside)} outside the scope of {task_id}")


def _hidden_by_index_flags(root: str) -> list[str]:
    """Tracked paths whose `ls-files -v` tag is h, S or s: their changes are invisible to status."""
    listed = git(root, "ls-files", "-v", "-z", "--").stdout.decode("utf-8", "surrogateescape")
    return [entry[2:] for entry in listed.split("\0") if entry[:1] in HIDING_INDEX_FLAGS and entry[1:2] == " "]


def _lookup_records(stdout: bytes) -> list[LookupRecord]:
    records = []
    for chunk in stdout.decode("utf-8", "replace").split("\x1e"):
        fields = chunk.strip("\n").split("\0")
        if len(fields) == 6 and fields[0]:
            records.append(LookupRecord(fields[0], fields[1].split(), fields[2], fields[3], fields[4],
                                        fields[5].strip()))
    return records


# ---------------------------------------------------------------- helpers: the settled run


def _settled(lane_path: str, task_id: str, evidence: SettledEvidence | None) -> SettledEvidence:
    """The settled run must be done and its audit pair, read from the Lane, a done pair of this run."""
    not_done = f"cannot commit child {task_id}: task is not settled done"
    if evidence is None or evidence.task_id != task_id:
        raise PortError(f"{not_done} (no settled run)")
    if evidence.lifecycle != "done":
        raise PortError(f"{not_done} (lifecycle is {evidence.lifecycle})")
    try:
        expected_paths = audit_paths(task_id, evidence.run_id)
    except ValueError as error:
        raise PortError(f"batch commit exported audit pair does not match the settled run: {error}") from None
    if (evidence.record_path, evidence.proof_path) != expected_paths:
        raise PortError("batch commit exported audit pair does not match the settled run")
    try:
        record = _read_plain_file(lane_path, evidence.record_path, MAX_EVIDENCE_BYTES * 64)
        proof = _read_plain_file(lane_path, evidence.proof_path, MAX_EVIDENCE_BYTES)
    except PortError as error:
        if str(error).startswith("missing:"):
            raise PortError(f"{not_done} (audit pair missing)") from None
        raise PortError(f"batch commit exported audit pair does not match the settled run: {error}") from None
    _verify_audit_pair(task_id, record, proof)
    return evidence


def _verify_audit_pair(task_id: str, record: bytes, proof: bytes) -> None:
    """verify_pair, reporting a record that is not done first, as upstream reads the run before the proof."""
    try:
        lifecycle = parse_json(record.decode("utf-8")).get("lifecycle")
    except (UnicodeDecodeError, ValueError, AttributeError):
        lifecycle = "done"  # unreadable: verify_pair names the problem
    if lifecycle != "done":
        raise PortError(f"cannot commit child {task_id}: task is not settled done (lifecycle is {lifecycle})")
    problem = verify_pair(task_id, record, proof)
    if problem is None:
        return
    if problem.startswith("task record lifecycle is "):
        raise PortError(f"cannot commit child {task_id}: task is not settled done "
                        f"(lifecycle is {problem.removeprefix('task record lifecycle is ')})")
    if problem in ("audit task id mismatch", "terminal proof lifecycle is not done"):
        raise PortError(f"cannot commit child {task_id}: {problem}")
    raise PortError(f"batch commit exported audit pair does not match the settled run: {problem}")


# ---------------------------------------------------------------- helpers: files in a Lane or the coordinator


def _read_plain_file(root: str, relative: str, limit: int) -> bytes:
    """The bytes of `root/relative`, a regular file reached through plain directories only.

    Raises PortError "missing: ..." when absent and "invalid: ..." for a symlink on the
    path, a file that is not regular, one larger than `limit`, or one replaced while read.
    """
    parts = relative.split("/")
    if relative.startswith("/") or any(part in ("", ".", "..") for part in parts):
        raise PortError(f"invalid: {relative} is not a plain repository-relative path")
    current = root
    for part in parts[:-1]:
        current = os.path.join(current, part)
        _require_plain(current, relative, stat.S_ISDIR, "directory")
    path = os.path.join(root, *parts)
    seen = _require_plain(path, relative, stat.S_ISREG, "regular file")
    if seen.st_size > limit:
        raise PortError(f"invalid: {relative} is larger than {limit} bytes")
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as error:
        raise PortError(f"invalid: {relative} cannot be opened: {error.strerror}") from None
    with os.fdopen(descriptor, "rb") as handle:
        opened = os.fstat(handle.fileno())
        if (opened.st_dev, opened.st_ino) != (seen.st_dev, seen.st_ino):
            raise PortError(f"invalid: {relative} changed while it was read")
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise PortError(f"invalid: {relative} is larger than {limit} bytes")
    return data


def _require_plain(path: str, relative: str, is_kind: Any, kind: str) -> os.stat_result:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise PortError(f"missing: {relative} does not exist") from None
    except OSError as error:
        raise PortError(f"invalid: {relative} cannot be read: {error.strerror}") from None
    if stat.S_ISLNK(info.st_mode):
        raise PortError(f"invalid: {relative} is reached through a symlink")
    if not is_kind(info.st_mode):
        raise PortError(f"invalid: {relative} is not a {kind}")
    return info


def _evidence_path(batch_id: str, task_id: str) -> str:
    return f"{COMMIT_EVIDENCE_DIR}/{batch_id}-{task_id}.json"


def _read_commit_evidence(lane_path: str, batch_id: str, task_id: str) -> str | None:
    """The commit the evidence file names, or None when it is absent or is not this child's evidence."""
    try:
        data = _read_plain_file(lane_path, _evidence_path(batch_id, task_id), MAX_EVIDENCE_BYTES)
        document = parse_json(data.decode("utf-8"))
    except (PortError, UnicodeDecodeError, ValueError):
        return None
    if (not isinstance(document, dict) or document.get("contract") != COMMIT_EVIDENCE_CONTRACT
            or document.get("batch_id") != batch_id or document.get("task_id") != task_id):
        return None
    commit = document.get("commit")
    return commit if isinstance(commit, str) and commit else None


def _write_commit_evidence(lane_path: str, batch_id: str, task_id: str, commit: str, parent_head: str) -> None:
    """`.imm/state/batches/commits/<batch>-<task>.json` in the Lane (its ignored state); the intent goes."""
    _write_state_document(lane_path, _evidence_path(batch_id, task_id), {
        "contract": COMMIT_EVIDENCE_CONTRACT, "batch_id": batch_id, "task_id": task_id, "commit": commit,
        "parent_head": parent_head, "created_at": format_timestamp(datetime.now(timezone.utc))})
    try:
        os.unlink(os.path.join(lane_path, _intent_path(batch_id, task_id)))
    except FileNotFoundError:
        pass


def _intent_path(batch_id: str, task_id: str) -> str:
    return f"{COMMIT_EVIDENCE_DIR}/{batch_id}-{task_id}.intent.json"


def _was_about_to_commit(lane_path: str, batch_id: str, task_id: str, match: Any, expected_head: str) -> bool:
    """Whether this runner recorded, before committing, the intent to commit exactly `match`."""
    try:
        data = _read_plain_file(lane_path, _intent_path(batch_id, task_id), MAX_EVIDENCE_BYTES)
        document = parse_json(data.decode("utf-8"))
    except (PortError, UnicodeDecodeError, ValueError):
        return False
    if (not isinstance(document, dict) or document.get("contract") != COMMIT_INTENT_CONTRACT
            or document.get("batch_id") != batch_id or document.get("task_id") != task_id
            or document.get("parent_head") != expected_head or match.parents != [expected_head]):
        return False
    tree = git_ok(lane_path, "rev-parse", "--verify", "--quiet", f"{match.commit}^{{tree}}")
    return tree.exit_code == 0 and tree.text == document.get("tree")


def _write_state_document(lane_path: str, relative: str, document: dict[str, Any]) -> None:
    """A JSON document under the Lane's ignored `.imm/state/batches/commits/`, written atomically."""
    directory = lane_path
    for part in COMMIT_EVIDENCE_DIR.split("/"):
        directory = os.path.join(directory, part)
        if os.path.islink(directory):
            raise PortError(f"commit_failed: {COMMIT_EVIDENCE_DIR} is reached through a symlink in the Lane")
        os.makedirs(directory, mode=0o700, exist_ok=True)
    data = (json.dumps(document, indent=2) + "\n").encode("utf-8")
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
        os.replace(temporary, os.path.join(lane_path, relative))
    except BaseException:
        if os.path.lexists(temporary):
            os.unlink(temporary)
        raise
