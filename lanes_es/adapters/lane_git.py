"""`GitLaneInspector`: what the tick reads of the coordinator and its Lanes in git (the LaneInspector port:
docs/upstream.md#lane-inspection-and-admission, #the-batch-lineage, #the-guarded-integration's search).

One read of the coordinator checkout, the facts of an offered or bound Lane, the batch lineage, the
search for an integration a crash interrupted, and whether a task's audit pair is on the batch branch;
and the porcelain and diff-tree readers the candidate builder (candidate_git.py) shares.

Every spawn costs milliseconds, so each operation is built from as few git commands as
its checks allow; the comments say which upstream calls one command stands for.
"""

from __future__ import annotations

import os
import msgspec

from lanes_es.adapters.git import git, git_ok
from lanes_es.adapters.git_dirs import find_checkout
from lanes_es.domain.ids import is_valid_id
from lanes_es.ports import CoordinatorView, GitFailure, LaneFacts, Lineage

LINEAGE_BROKEN = "batch_head_lineage_broken"
CONFLICT = "batch_integration_conflict"
CHECK_FAILED = "batch_integration_check_failed"
BATCH_TRAILER = "Immune-Brain-Batch"
STATUS_ARGS = ("status", "--porcelain=v2", "--branch", "-z", "--untracked-files=all", "--ignore-submodules=none",
               "--no-renames")
# diff-tree reads "<to> <from>" lines on stdin and prints "<to>\0" before each pair's records.
IDENTITY_ARGS = ("diff-tree", "--stdin", "--always", "-r", "-z", "--raw", "--no-renames", "--no-ext-diff")
# The fields of a lane commit its candidate takes (docs/upstream.md#the-guarded-integration: log's %B, its newline terminator included).
LOG_META = "%an%x00%ae%x00%aI%x00%B"
AUDIT_RECORD = "task-record.json"
AUDIT_PROOF = "terminal-proof.json"


# ---------------------------------------------------------------- porcelain v2


class StatusRead(msgspec.Struct, frozen=True, kw_only=True):
    """One `git status --porcelain=v2 --branch -z`: branch, HEAD, and entries as porcelain v1 codes.

    `dirty_submodules` lists submodule entries whose own worktree has changes that a
    `git add` in the parent cannot capture.
    """

    branch: str | None
    head: str | None
    entries: list[tuple[str, str]]
    dirty_submodules: list[str] = []


def read_status(root: str) -> StatusRead:
    """Run STATUS_ARGS at `root` (one spawn); GitFailure when git refuses."""
    return parse_status_v2(git(root, *STATUS_ARGS).stdout)


def parse_status_v2(stdout: bytes) -> StatusRead:
    """Parse porcelain v2 with `-z`: headers, ordinary (1), renamed (2), unmerged (u), untracked (?)."""
    branch: str | None = None
    head: str | None = None
    entries: list[tuple[str, str]] = []
    dirty_submodules: list[str] = []
    tokens = stdout.decode("utf-8", "surrogateescape").split("\0")
    index = 0
    while index < len(tokens):
        record = tokens[index]
        index += 1
        if record.startswith("# branch.oid "):
            oid = record[len("# branch.oid "):]
            head = None if oid == "(initial)" else oid
        elif record.startswith("# branch.head "):
            name = record[len("# branch.head "):]
            branch = None if name == "(detached)" else name
        elif record.startswith("1 "):
            fields = record.split(" ", 8)
            entries.append((_v1_code(fields[1]), fields[8]))
            _note_submodule(fields[2], fields[8], dirty_submodules)
        elif record.startswith("2 "):
            fields = record.split(" ", 9)
            entries.append((_v1_code(fields[1]), fields[9]))
            _note_submodule(fields[2], fields[9], dirty_submodules)
            index += 1  # the original path follows as its own token
        elif record.startswith("u "):
            fields = record.split(" ", 10)
            entries.append((fields[1], fields[10]))
        elif record.startswith("? "):
            entries.append(("??", record[2:]))
    return StatusRead(branch=branch, head=head, entries=entries, dirty_submodules=dirty_submodules)


def _v1_code(xy: str) -> str:
    """v2 writes an unchanged side as '.', v1 as ' '."""
    return xy.replace(".", " ")


def _note_submodule(field: str, path: str, dirty: list[str]) -> None:
    """`S<c><m><u>`: a submodule whose commit changed is stageable; modified or untracked content is not."""
    if field.startswith("S") and (field[2:3] == "M" or field[3:4] == "U"):
        dirty.append(path)


# ---------------------------------------------------------------- small helpers


def real_path(path: str) -> str | None:
    """realpath of an existing path, else None (Node's realpathSync throws on a missing path)."""
    try:
        return os.path.realpath(path, strict=True)
    except (OSError, ValueError):
        return None


def _common_dir_and_top(path: str) -> tuple[str, str] | None:
    """The real paths of the git common dir and the worktree top level holding `path`: read from git's
    files when they can be (no spawn), else one `rev-parse`; None outside a repository."""
    found = find_checkout(path)
    if found is not None:
        common, top = real_path(str(found.common_dir)), real_path(str(found.top))
    else:
        probe = git_ok(path, "rev-parse", "--path-format=absolute", "--git-common-dir", "--show-toplevel")
        lines = probe.text.split("\n") if probe.exit_code == 0 else []
        common, top = (real_path(lines[0]), real_path(lines[1])) if len(lines) == 2 else (None, None)
    return (common, top) if common is not None and top is not None else None


def branch_and_head(root: str) -> tuple[str | None, str | None]:
    """The current branch (None when detached) and HEAD (None when unborn or unreadable): one spawn."""
    probe = git_ok(root, "rev-parse", "HEAD", "--symbolic-full-name", "HEAD")
    if probe.exit_code == 0:
        lines = probe.text.split("\n")
        if len(lines) == 2:
            return short_branch(lines[1]), lines[0]
    try:  # unborn HEAD: status still names the branch
        status = read_status(root)
    except GitFailure:
        return None, None
    return status.branch, status.head


def short_branch(symbolic: str) -> str | None:
    return symbolic[len("refs/heads/"):] if symbolic.startswith("refs/heads/") else None


def change_identities(root: str, pairs: list[tuple[str, str]]) -> list[dict[str, str]]:
    """`changeIdentity(from, to)` of each (from, to) pair, in one diff-tree spawn.

    An identity maps each changed path to `"<newmode> <newsha>"`; a deletion maps to the
    zero mode and sha, as upstream's parse of `--raw` gives it.
    """
    if not pairs:
        return []
    stdin = "".join(f"{to} {origin}\n" for origin, to in pairs)
    tokens = git(root, *IDENTITY_ARGS, stdin=stdin).stdout.decode("utf-8", "surrogateescape").split("\0")
    identities: list[dict[str, str]] = []
    index = 0
    while index < len(tokens):
        token = tokens[index]
        index += 1
        if not token:
            continue
        if not token.startswith(":"):
            identities.append({})  # "<to>" header: the next pair's records follow
            continue
        fields = token[1:].split(" ")
        if len(fields) < 4 or index >= len(tokens) or not identities:
            raise GitFailure(f"unreadable change record in diff-tree output: {token!r}")
        identities[-1][tokens[index]] = f"{fields[1]} {fields[3]}"
        index += 1
    if len(identities) != len(pairs):
        raise GitFailure(f"diff-tree reported {len(identities)} changes for {len(pairs)} pairs")
    return identities


def lineage_broken(detail: str) -> str:
    return f"{LINEAGE_BROKEN}: {detail}"


# ---------------------------------------------------------------- the port


class GitLaneInspector:
    """LaneInspector on real git. One instance per tick: it caches the coordinator's common dir and the audit
    listings it read."""

    def __init__(self) -> None:
        self._common_dirs: dict[str, str | None] = {}
        self._audit_listings: dict[tuple[str, str], set[str] | None] = {}  # (root, commit) -> its .imm/audit files

    # ------------------------------------------------------------ coordinator and Lanes

    def coordinator_view(self, root: str) -> CoordinatorView:
        """Branch, HEAD and porcelain entries of the coordinator: one status spawn."""
        status = read_status(root)
        return CoordinatorView(branch=status.branch, head=status.head, entries=status.entries)

    def resolve_root(self, root: str) -> str:
        return real_path(root) or root

    def inspect_lane(self, coordinator_root: str, lane_path: str) -> LaneFacts:
        """docs/upstream.md#lane-inspection-and-admission in one spawn per Lane: its status.

        Upstream's five reads (common dir, show-toplevel, symbolic-ref, rev-parse HEAD,
        status) become the Lane's and the coordinator's git directories, read from git's own
        files (`find_checkout`; a `rev-parse` where only git can say), and one porcelain v2
        status, which carries the branch, HEAD and cleanliness together. The claim is left to
        the tick (it asks the kernel).
        """
        real = real_path(lane_path) if os.path.exists(lane_path) else None
        if real is None:
            return LaneFacts(exists=False, real_path=None)
        foreign = LaneFacts(exists=True, real_path=real)
        coordinator_common = self._coordinator_common_dir(coordinator_root)
        located = _common_dir_and_top(real)
        if located is None or coordinator_common is None or located[0] != coordinator_common:
            return foreign
        status = git_ok(real, *STATUS_ARGS)
        read = parse_status_v2(status.stdout) if status.exit_code == 0 else None
        return LaneFacts(
            exists=True,
            real_path=real,
            same_repository=True,
            is_worktree_root=located[1] == real,
            branch=read.branch if read else None,
            head=read.head if read else None,
            clean=read is not None and not read.entries,
        )

    def _coordinator_common_dir(self, root: str) -> str | None:
        if root not in self._common_dirs:
            located = _common_dir_and_top(root)
            self._common_dirs[root] = located[0] if located is not None else None
        return self._common_dirs[root]

    # ------------------------------------------------------------ lineage

    def classify_lineage(self, root: str, branch: str, expected_head: str, commits: list[str], batch_id: str,
                         view: CoordinatorView | None = None) -> Lineage:
        """docs/upstream.md#the-batch-lineage: equal, fast_forward (a user's fast-forward to adopt) or broken.

        With a `view` the branch and HEAD cost nothing. When HEAD is the expected head no
        ancestry is checked: the expected head is the last recorded commit or base, followed
        through adoptions, and each of those was reached by a verified fast-forward, so every
        recorded commit is its ancestor by construction.
        """
        current_branch, head = (view.branch, view.head) if view is not None else branch_and_head(root)
        if current_branch != branch:
            shown = current_branch if current_branch is not None else "(detached)"
            return self._broken(head, f"current branch {shown} does not match expected branch {branch}")
        if head is None:
            return self._broken(None, "current HEAD is unreadable")
        if head == expected_head:
            return Lineage(kind="equal", head=head)
        problem = self._ancestry_problem(root, head, expected_head, commits)
        if problem is not None:
            return self._broken(head, problem)
        claimed = git_ok(root, "log", "--fixed-strings", f"--grep={BATCH_TRAILER}: {batch_id}", "--format=%H",
                         f"{expected_head}..{head}")
        if claimed.exit_code != 0:
            return self._broken(head, f"the commits between {expected_head} and {head} cannot be read")
        if claimed.text:
            first = claimed.text.split("\n")[-1]
            return self._broken(head, f"commit {first} claims batch {batch_id} without recorded evidence")
        return Lineage(kind="fast_forward", head=head)

    @staticmethod
    def _broken(head: str | None, detail: str) -> Lineage:
        return Lineage(kind="broken", head=head or "", message=lineage_broken(detail))

    @staticmethod
    def _ancestry_problem(root: str, head: str, expected: str, commits: list[str]) -> str | None:
        """Is `expected` and every recorded commit an ancestor of `head`? One rev-list answers all.

        `rev-list <expected> <commits> --not <head>` lists exactly the given commits (and
        their history) that HEAD does not contain; it is empty when all of them descend.
        """
        wanted = list(dict.fromkeys([expected, *commits]))
        listed = git_ok(root, "rev-list", *wanted, "--not", head)
        if listed.exit_code == 0:
            missing = set(listed.text.split())
        else:  # an unknown commit id: ask one by one, so the message names the right one
            missing = {commit for commit in wanted
                       if git_ok(root, "merge-base", "--is-ancestor", commit, head).exit_code != 0}
        if expected in missing:
            return f"current HEAD {head} does not descend from expected batch head {expected}"
        for commit in commits:
            if commit in missing:
                return f"recorded commit {commit} is no longer reachable from HEAD"
        return None

    # ------------------------------------------------------------ crash recovery and release

    def find_integrated(self, root: str, task_id: str, batch_id: str, from_head: str, lane_base: str,
                        lane_commit: str) -> str | None:
        """findIntegratedCandidate: a batch commit in from..HEAD for this task whose change is the lane change.

        One log spawn; one diff-tree spawn for all matching commits (upstream: a rev-parse
        and a diff-tree per match).
        """
        listed = git_ok(root, "log", "--fixed-strings", f"--grep=imm({task_id}):",
                        f"--format=%x01%H%x00%P%x00%(trailers:key={BATCH_TRAILER},valueonly)%x00%s",
                        f"{from_head}..HEAD")
        if listed.exit_code != 0:
            raise GitFailure(f"failed to search for integrated {task_id}: {listed.error_text}")
        matches: list[tuple[str, str]] = []
        for record in listed.stdout.decode("utf-8", "replace").split("\x01"):
            fields = record.split("\0")
            if len(fields) < 4 or not fields[0] or not fields[1]:
                continue
            commit, parents, trailer, subject = fields[0], fields[1].split(), fields[2], fields[3]
            if trailer.strip() == batch_id and subject.strip().startswith(f"imm({task_id}):"):
                matches.append((parents[0], commit))
        if not matches:
            return None
        lane_change, *found = change_identities(root, [(lane_base, lane_commit), *matches])
        for (_, commit), change in zip(matches, found):
            if change == lane_change:
                return commit
        return None

    def audit_reachable(self, root: str, head: str, task_id: str) -> bool:
        """A directory under `.imm/audit/<task>` in `head`'s tree holds both files of the audit pair (one `ls-tree`
        per commit and tick, whatever the Lanes asked about)."""
        if not is_valid_id(task_id):
            return False
        audit = f".imm/audit/{task_id}"
        # One listing of the commit's `.imm/audit` serves every Lane a tick releases (a commit never changes).
        if (root, head) not in self._audit_listings:
            listing = git_ok(root, "ls-tree", "-r", "-z", "--name-only", "--full-tree", head, "--", ".imm/audit")
            self._audit_listings[(root, head)] = (set(listing.stdout.decode("utf-8", "replace").split("\0"))
                                                  if listing.exit_code == 0 else None)
        listed = self._audit_listings[(root, head)]
        if listed is None:
            return False
        files = {path for path in listed if path == audit or path.startswith(audit + "/")}
        directories = {path.rsplit("/", 1)[0] for path in files}
        return any(f"{directory}/{AUDIT_RECORD}" in files and f"{directory}/{AUDIT_PROOF}" in files
                   for directory in directories)


__all__ = ["GitLaneInspector", "StatusRead", "read_status", "parse_status_v2", "change_identities",
           "branch_and_head", "short_branch", "real_path", "lineage_broken"]
