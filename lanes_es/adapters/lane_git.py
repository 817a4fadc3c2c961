"""`GitLanes`: the LaneGit port on real git (docs/upstream.md#lane-inspection-and-admission, #the-batch-lineage, #the-guarded-integration).

What the tick asks of git at the coordinator and about each Lane: one read of the
coordinator checkout, the facts of an offered or bound Lane, the batch lineage, the guarded
integration of a lane commit onto the batch branch, the search for an integration a crash
interrupted, and whether a task's audit pair is on the batch branch.

Every spawn costs milliseconds, so each operation is built from as few git commands as
its checks allow; the comments say which upstream calls one command stands for.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Iterable

import msgspec

from lanes_es.adapters.check_runner import CheckTree, TreeEntry, run_in_turn
from lanes_es.adapters.git import batch_identity_env, git, git_ok
from lanes_es.adapters.git_dirs import find_checkout
from lanes_es.domain.candidates import check_failure_reason
from lanes_es.domain.check_inputs import acceptance_digest, hidden_from_checks
from lanes_es.domain.ids import is_valid_id
from lanes_es.domain.jstext import parse_json
from lanes_es.ports import (
    CandidateBuild,
    CandidateCheck,
    CandidateChecks,
    CandidateVerdict,
    CoordinatorView,
    GitFailure,
    IntegrationChild,
    IntegrationError,
    IntegrationRequest,
    LaneFacts,
    Lineage,
    PlannedCheck,
)

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
            return _short_branch(lines[1]), lines[0]
    try:  # unborn HEAD: status still names the branch
        status = read_status(root)
    except GitFailure:
        return None, None
    return status.branch, status.head


def _short_branch(symbolic: str) -> str | None:
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


class GitLanes:
    """LaneGit on real git. One instance per tick: it caches the coordinator's common dir."""

    _merge_tree_has_merge_base: bool | None = None  # per process: the installed git does not change

    def __init__(self) -> None:
        self._common_dirs: dict[str, str | None] = {}
        # What a round's chains learned, kept for the tick (commits and trees never change):
        self._lane_facts: dict[str, LaneCommit] = {}  # lane commit -> parents, log's author and message
        self._ancestry: dict[str, tuple[str, frozenset[str]]] = {}  # built candidate -> (anchor, commits added)
        self._listings: dict[str, dict[str, TreeEntry]] = {}  # commit -> its full listing
        self._blobs: dict[str, bytes] = {}
        self._content_digests: dict[tuple[str, str], str] = {}  # (blob, mode) -> protected-input digest
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

    # ------------------------------------------------------------ guarded integration

    def integrate(self, request: IntegrationRequest, checks: list[CandidateCheck] | None = None,
                  verify: Callable[[CandidateChecks], CandidateVerdict] | None = None) -> str:
        """docs/upstream.md#the-guarded-integration: verify, build the candidate, rerun the descriptors, fast-forward.

        Returns the new batch head; `checks` receives each task's rerun (for the log). `verify` runs the
        rerun (the tick's: its workers, its reuse of verdicts); without it the checks run here one after
        another. Every refusal raises IntegrationError before the merge, so the branch, index, worktree
        and refs stay where they were (candidate objects are unreferenced). A git failure that is not a
        refusal is reported as upstream's driver files a plain error: as a conflict.
        """
        try:
            candidate, landed_since_base = self._prepare_candidate(request)
            planned = self._planned_checks(request, candidate, landed_since_base, CandidateTree.read)
            verdict = (verify or run_in_turn)(planned)
            if checks is not None:
                checks.extend(verdict.checks)
            if not verdict.passed:
                raise IntegrationError(CHECK_FAILED, verdict.reason or check_failure_reason([], candidate),
                                       candidate=candidate, checks=verdict.checks)
            return self._fast_forward(request.root, candidate)
        except IntegrationError:
            raise
        except GitFailure as error:
            raise IntegrationError(CONFLICT, f"{CONFLICT}: {error}") from None

    def _prepare_candidate(self, request: IntegrationRequest) -> tuple[str, set[str]]:
        """The lineage checks (upstream's messages, LANE-INT-04), then the candidate and its identity.

        Also returns the commits that landed on the batch branch since the lane base (`base..head`).
        """
        current_branch, current_head, parents = self._integration_facts(request.root, request.lane_commit)
        _require_lineage(current_branch, current_head, request.branch, request.batch_head)
        return self._candidate_on(request, parents)

    def _candidate_on(self, request: IntegrationRequest, parents: list[str] | None) -> tuple[str, set[str]]:
        """The lane commit's identity checks, then the candidate on `request.batch_head` (the branch's
        head, or a candidate not yet landed) and the commits in lane_base..batch_head."""
        root, head, base, lane = request.root, request.batch_head, request.lane_base, request.lane_commit
        if parents is None:
            raise GitFailure(f"failed to read parents of {lane}")
        if len(parents) != 1:
            raise IntegrationError(LINEAGE_BROKEN, lineage_broken(
                f"lane commit {lane} has {len(parents)} parents, expected exactly one"))
        if parents[0] != base:
            raise IntegrationError(LINEAGE_BROKEN, lineage_broken(
                f"lane commit {lane} does not descend from lane base {base}"))
        if head == base:
            return lane, set()  # the lane commit itself: its change is the lane change by definition
        landed_since_base = self._landed_since_base(root, head, base, lane)
        candidate = self._commit_candidate(root, head, base, lane, None)
        lane_change, candidate_change = change_identities(root, [(base, lane), (head, candidate)])
        if lane_change != candidate_change:
            raise _lost_change(candidate, lane)
        return candidate, landed_since_base

    @staticmethod
    def _integration_facts(root: str, lane: str) -> tuple[str | None, str | None, list[str] | None]:
        """Branch, HEAD and the lane commit's parents (None when unreadable): one rev-parse for
        upstream's three calls, two more only when that fails (unborn HEAD, unknown lane commit)."""
        probe = git_ok(root, "rev-parse", "HEAD", f"{lane}^@", "--symbolic-full-name", "HEAD")
        lines = probe.text.split("\n") if probe.exit_code == 0 else []
        if len(lines) >= 2:
            return _short_branch(lines[-1]), lines[0], lines[1:-1]
        current_branch, current_head = branch_and_head(root)
        parents = git_ok(root, "rev-parse", f"{lane}^@")
        return current_branch, current_head, parents.text.split() if parents.exit_code == 0 else None

    @staticmethod
    def _landed_since_base(root: str, head: str, base: str, lane: str) -> set[str]:
        """Prove `merge-base head lane` is the lane base, and list `base..head`, in one rev-list.

        `rev-list --left-right lane...head` lists on the left what the lane commit has and
        head lacks, on the right what head has and the lane commit lacks. The lane commit's
        single parent is the base, so the left side is exactly [lane] when the base is an
        ancestor of head (the merge base is then the base), empty when the lane commit is
        already in head, and holds the base otherwise; the right side is then `base..head`.
        """
        listed = git(root, "rev-list", "--left-right", f"{lane}...{head}").text.split()
        left = [line[1:] for line in listed if line.startswith("<")]
        if left == [lane]:
            return {line[1:] for line in listed if line.startswith(">")}
        if not left:
            raise _already_in(lane, head)
        raise IntegrationError(LINEAGE_BROKEN, lineage_broken(f"lane base {base} is not an ancestor of batch head "
                                                              f"{head}"))

    @classmethod
    def _supports_merge_base(cls, root: str) -> bool:
        """git 2.40+ has `merge-tree --merge-base`; 2.39 does not. Asked once per process."""
        if cls._merge_tree_has_merge_base is None:
            usage = git_ok(root, "merge-tree", "-h")
            cls._merge_tree_has_merge_base = b"--merge-base" in usage.stdout + usage.stderr
        return cls._merge_tree_has_merge_base

    def _planned_checks(self, request: IntegrationRequest, candidate: str, landed_since_base: set[str],
                        read_tree: Callable[[str, str], "CheckTree"], flake_reruns: int = 0) -> CandidateChecks:
        """docs/upstream.md#the-descriptor-rerun-and-deterministic-qa: the candidate's tree (read once, shared by its checks) and the tasks to rerun on it
        (the child, then each sibling landed since the lane base), their intents as the candidate holds them;
        under a flake policy, their intents at the lane base too (one cat-file)."""
        siblings = [sibling for sibling in request.siblings if sibling.commit and sibling.commit in landed_since_base]
        checks = [request.child, *siblings]
        for check in checks:
            if not check.intent_path:
                raise IntegrationError(CHECK_FAILED, f"{CHECK_FAILED}: {check.task_id} has no intent to rerun")
        try:
            tree = read_tree(request.root, candidate)
        except GitFailure as error:
            raise IntegrationError(CHECK_FAILED, f"{CHECK_FAILED}: the descriptor rerun could not complete: "
                                                 f"{error}") from None
        intents = [(check.task_id, self._candidate_intent(tree, candidate, check)) for check in checks]
        _require_valid_descriptors(intents)
        at_base = _intents_at(request.root, request.lane_base, checks) if flake_reruns else {}
        planned = [PlannedCheck(task_id=task_id, intent=intent, acceptance=acceptance_digest(intent),
                                at_base=at_base.get(task_id)) for task_id, intent in intents]
        return CandidateChecks(commit=candidate, tree=tree, tree_identity=tree.identity, checks=planned)

    # ------------------------------------------------------------ candidates of a round (speculative, batched)

    def build_candidate(self, request: IntegrationRequest) -> CandidateBuild:
        """One candidate on `request.batch_head`: a chain of one."""
        built = self.build_chain(request.root, request.batch_head, [(request.lane_base, request.lane_commit)])[0]
        if isinstance(built, IntegrationError):
            raise built
        return built

    def build_chain(self, root: str, parent: str, lanes: list[tuple[str, str]]
                    ) -> list[CandidateBuild | IntegrationError]:
        """The cumulative candidates parent + L1, + L2, ... for (lane base, lane commit) pairs, in order.

        Each candidate passes serial's checks (`_candidate_on`) and is the commit serial would build,
        but the chain costs few spawns: the lane commits' parents, authors and messages in one `log`
        per round, no `rev-list` where the lane base is the chain's anchor (the ancestry is then known
        from the chain itself), a `merge-tree` and a `commit-tree` per candidate, one `diff-tree` for
        every identity of the chain, and the candidates' trees derived from the anchor's listing and
        those identities (one `ls-tree` per anchor, one `cat-file` for the chain's new blobs), so that
        `candidate_checks` spawns nothing to read its tree. The result stops at the first failure.
        """
        try:
            commits = self._lane_commits(root, [lane for _, lane in lanes])
        except GitFailure as error:
            return [IntegrationError(CONFLICT, f"{CONFLICT}: {error}")]
        built: list[tuple[str, str, str, str, set[str]]] = []  # (parent, base, lane, candidate, landed)
        failure: IntegrationError | None = None
        for base, lane in lanes:
            on = built[-1][3] if built else parent
            try:
                candidate, landed = self._chain_link(root, on, base, lane, commits[lane])
            except IntegrationError as error:
                failure = error
                break
            except GitFailure as error:
                failure = IntegrationError(CONFLICT, f"{CONFLICT}: {error}")
                break
            built.append((on, base, lane, candidate, landed))
        results: list[CandidateBuild | IntegrationError] = []
        try:
            identities = self._chain_identities(root, built)
        except GitFailure as error:
            return [IntegrationError(CONFLICT, f"{CONFLICT}: {error}")]  # as serial, whose first link fails
        for index, ((_, _, lane, candidate, landed), (lane_change, candidate_change)) in enumerate(
                zip(built, identities)):
            if candidate_change is not None and lane_change != candidate_change:
                del built[index:]
                failure = _lost_change(candidate, lane)
                break
            results.append(CandidateBuild(commit=candidate, landed_since_base=sorted(landed)))
        try:
            self._remember_trees(root, built, identities)
        except GitFailure:
            pass  # verification then reads each tree from git
        return results + ([failure] if failure is not None else [])

    def _chain_link(self, root: str, head: str, base: str, lane: str, facts: "LaneCommit") -> tuple[str, set[str]]:
        """`_candidate_on` for one link: serial's checks and messages, the ancestry from the chain where it can."""
        if facts.parents is None:
            raise GitFailure(f"failed to read parents of {lane}")
        if len(facts.parents) != 1:
            raise IntegrationError(LINEAGE_BROKEN, lineage_broken(
                f"lane commit {lane} has {len(facts.parents)} parents, expected exactly one"))
        if facts.parents[0] != base:
            raise IntegrationError(LINEAGE_BROKEN, lineage_broken(
                f"lane commit {lane} does not descend from lane base {base}"))
        if head == base:
            self._ancestry[lane] = self._ancestry_of(head)[0], self._ancestry_of(head)[1] | {lane}
            return lane, set()
        landed = self._landed_from_chain(head, base, lane)
        if landed is None:
            landed = self._landed_since_base(root, head, base, lane)
        candidate = self._commit_candidate(root, head, base, lane, facts)
        anchor, added = self._ancestry_of(head)
        self._ancestry[candidate] = anchor, added | {candidate}
        return candidate, landed

    def _ancestry_of(self, commit: str) -> tuple[str, frozenset[str]]:
        """(anchor, added): the commits `commit` reaches are `added` and those the anchor reaches."""
        return self._ancestry.get(commit, (commit, frozenset()))

    def _landed_from_chain(self, head: str, base: str, lane: str) -> set[str] | None:
        """`base..head` without git when the base is the anchor of the chain `head` ends: head then reaches
        the base, the lane commit (a child of the anchor) is not under the anchor, and `base..head` is
        exactly the chain's own commits. None otherwise (git answers)."""
        anchor, added = self._ancestry_of(head)
        if base != anchor:
            return None
        if lane in added:
            raise _already_in(lane, head)
        return set(added)

    def _commit_candidate(self, root: str, head: str, base: str, lane: str, facts: "LaneCommit | None") -> str:
        """merge-tree, then commit-tree with the lane commit's message and author (LANE-INT-17), read after
        the merge as upstream does, unless the round read it already."""
        options = [f"--merge-base={base}"] if self._supports_merge_base(root) else []
        merged = git_ok(root, "merge-tree", "--write-tree", *options, head, lane)
        if merged.exit_code == 1:
            raise IntegrationError(CONFLICT, f"{CONFLICT}: lane commit {lane} does not apply cleanly onto batch "
                                             f"head {head}")
        tree = merged.text.split("\n")[0].strip() if merged.exit_code == 0 else ""
        if not tree:
            raise GitFailure(f"failed to build integration candidate: {merged.error_text or 'no tree produced'}")
        meta = facts.meta if facts is not None else git(root, "log", "-n", "1", f"--format={LOG_META}", lane).stdout
        return _commit_tree(root, tree, head, meta)

    def _lane_commits(self, root: str, lanes: list[str]) -> dict[str, "LaneCommit"]:
        """Parents and `log`'s author/message fields of each lane commit, read once per round for all of them."""
        wanted = [lane for lane in dict.fromkeys(lanes) if lane not in self._lane_facts]
        if wanted:
            self._lane_facts.update(_read_lane_commits(root, wanted))
        return {lane: self._lane_facts[lane] for lane in lanes}

    def _chain_identities(self, root: str, built: list[tuple[str, str, str, str, set[str]]]
                          ) -> list[tuple[dict[str, str], dict[str, str] | None]]:
        """Lane change and candidate change of every link, in one diff-tree (no candidate change when the
        candidate is the lane commit itself: its change is the lane change by definition)."""
        pairs: list[tuple[str, str]] = []
        for on, base, lane, candidate, _ in built:
            pairs += [(base, lane)] + ([(on, candidate)] if candidate != lane else [])
        changes = iter(change_identities(root, pairs))
        return [(next(changes), next(changes) if candidate != lane else None) for _, _, lane, candidate, _ in built]

    def _remember_trees(self, root: str, built: list[tuple[str, str, str, str, set[str]]],
                        identities: list[tuple[dict[str, str], dict[str, str] | None]]) -> None:
        """Each built candidate's listing: its parent's, with the change diff-tree reported between them
        (the lane commit itself: its base's with the lane change); then the chain's new blobs, in one read."""
        for (on, base, _, candidate, _), (lane_change, candidate_change) in zip(built, identities):
            if candidate not in self._listings:
                self._listings[candidate] = (_patched(self._listing(root, on), candidate_change)
                                             if candidate_change is not None
                                             else _patched(self._listing(root, base), lane_change))
        wanted = sorted({entry.sha for _, _, _, candidate, _ in built
                         for entry in self._listings[candidate].values()
                         if entry.kind == "blob" and entry.sha not in self._blobs})
        self._blobs.update(_read_blobs(root, wanted))

    def _listing(self, root: str, commit: str) -> dict[str, "TreeEntry"]:
        if commit not in self._listings:
            self._listings[commit] = _read_listing(root, commit)
        return self._listings[commit]

    def _candidate_tree(self, root: str, commit: str) -> "CandidateTree":
        """A built candidate's tree from what the chain remembered; read from git when it was not built here."""
        listing = self._listings.get(commit)
        if listing is None or any(entry.kind == "blob" and entry.sha not in self._blobs
                                  for entry in listing.values()):
            return CandidateTree.read(root, commit)
        return CandidateTree(listing, self._blobs, self._content_digests)

    def candidate_checks(self, request: IntegrationRequest, build: CandidateBuild,
                         flake_reruns: int = 0) -> CandidateChecks:
        """What verifying a built candidate runs: as the serial rerun, its tree from what the chain remembered
        (no spawn), or read from git when it was not built here."""
        return self._planned_checks(request, build.commit, set(build.landed_since_base), self._candidate_tree,
                                    flake_reruns)

    def keep_candidate(self, root: str, ref: str, commit: str) -> str | None:
        """`update-ref` (one spawn): the failed candidate stays reachable, for a person to inspect."""
        return ref if git_ok(root, "update-ref", ref, commit).exit_code == 0 else None

    def land_candidate(self, root: str, branch: str, expected_head: str, commit: str) -> str:
        try:
            current_branch, current_head = branch_and_head(root)
            _require_lineage(current_branch, current_head, branch, expected_head)
            return self._fast_forward(root, commit)
        except IntegrationError:
            raise
        except GitFailure as error:
            raise IntegrationError(CONFLICT, f"{CONFLICT}: {error}") from None

    @staticmethod
    def _candidate_intent(tree: "CandidateTree", candidate: str, check: IntegrationChild) -> dict[str, Any]:
        from lanes_es.domain.intent import parse_task_intent  # the domain owns TaskIntent v1

        content = tree.file(check.intent_path or "")
        if content is None:
            raise IntegrationError(CHECK_FAILED, f"{CHECK_FAILED}: intent {check.intent_path} of {check.task_id} is "
                                                 f"absent from candidate {candidate}")
        try:
            return parse_task_intent(parse_json(content.decode("utf-8")))
        except (ValueError, UnicodeDecodeError) as error:
            raise IntegrationError(CHECK_FAILED, f"{CHECK_FAILED}: intent of {check.task_id} is unreadable in "
                                                 f"candidate {candidate}: {error}") from None

    @staticmethod
    def _fast_forward(root: str, candidate: str) -> str:
        moved = git_ok(root, "merge", "--ff-only", "--quiet", candidate)
        if moved.exit_code != 0:
            raise IntegrationError(CONFLICT, f"{CONFLICT}: batch branch could not fast-forward to {candidate}: "
                                             f"{moved.error_text or 'git merge failed'}")
        landed = git(root, "rev-parse", "HEAD").text
        if landed != candidate:
            raise IntegrationError(CONFLICT, f"{CONFLICT}: batch branch landed on {landed}, expected {candidate}")
        return candidate

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


# ---------------------------------------------------------------- the candidate tree


class LaneCommit(msgspec.Struct, frozen=True):
    """A lane commit's parents (None: unreadable) and `log --format=LOG_META` of it, as bytes."""

    parents: list[str] | None
    meta: bytes


def _read_lane_commits(root: str, lanes: list[str]) -> dict[str, LaneCommit]:
    """One `log --no-walk=unsorted` for every lane commit: the same fields `log -n 1` gives each.

    Records start with a random marker a message cannot predict. When git refuses (an unknown
    commit among them), each is read alone, so only the unreadable one fails, as serial's does."""
    import secrets

    marker = secrets.token_hex(16)
    listed = git_ok(root, "log", "--no-walk=unsorted", f"--format={marker}%H%x00%P%x00{LOG_META}", *lanes, "--")
    if listed.exit_code != 0:
        return {lane: _read_lane_commit(root, lane) for lane in lanes}
    found: dict[str, LaneCommit] = {}
    for record in listed.stdout.split(marker.encode())[1:]:
        commit, parents, meta = record.split(b"\0", 2)
        found[commit.decode("ascii")] = LaneCommit(parents=parents.decode("ascii").split(), meta=meta)
    return {lane: found.get(lane) or _read_lane_commit(root, lane) for lane in lanes}


def _read_lane_commit(root: str, lane: str) -> LaneCommit:
    parents = git_ok(root, "rev-parse", f"{lane}^@")
    if parents.exit_code != 0:
        return LaneCommit(parents=None, meta=b"")
    return LaneCommit(parents=parents.text.split(),
                      meta=git(root, "log", "-n", "1", f"--format={LOG_META}", lane).stdout)


def _commit_tree(root: str, tree: str, parent: str, meta: bytes) -> str:
    """commit-tree of `tree` on `parent` with the lane commit's author and message, byte for byte."""
    # The message is log's %B output taken raw, newline terminator included, as upstream passes it
    # to commit-tree (docs/upstream.md#the-guarded-integration); commit-tree stores it byte for byte.
    name, email, date, message = meta.split(b"\0", 3)
    env = {**batch_identity_env(), "GIT_AUTHOR_NAME": name.decode("utf-8", "surrogateescape"),
           "GIT_AUTHOR_EMAIL": email.decode("utf-8", "surrogateescape"),
           "GIT_AUTHOR_DATE": date.decode("ascii", "replace")}
    created = git(root, "commit-tree", tree, "-p", parent, "-F", "-", stdin=message, env=env).text.strip()
    if not created:
        raise GitFailure("failed to build integration candidate: git commit-tree printed no commit")
    return created


def _read_listing(root: str, commit: str) -> dict[str, TreeEntry]:
    """Every entry of `commit`'s tree, recursively (ls-tree -r: files, symlinks, submodules)."""
    listing = git(root, "ls-tree", "-r", "-z", "--full-tree", commit).stdout.decode("utf-8", "surrogateescape")
    entries: dict[str, TreeEntry] = {}
    for record in listing.split("\0"):
        if not record:
            continue
        meta, path = record.split("\t", 1)
        mode, kind, sha = meta.split(" ")
        entries[path] = TreeEntry(mode, kind, sha)
    return entries


def _patched(listing: dict[str, TreeEntry], change: dict[str, str]) -> dict[str, TreeEntry]:
    """`listing` with a change identity (path -> "<mode> <sha>", the zero mode for a removal) applied."""
    patched = dict(listing)
    for path, held in change.items():
        mode, sha = held.split(" ")
        if mode.strip("0") == "":
            patched.pop(path, None)
        else:
            patched[path] = TreeEntry(mode, "commit" if mode == "160000" else "blob", sha)
    return dict(sorted(patched.items()))


class CandidateTree(CheckTree):
    """A CheckTree read from git: `ls-tree`, then every blob a check sees in one `cat-file` (two spawns,
    whatever the tree's size)."""

    @classmethod
    def read(cls, root: str, commit: str) -> "CandidateTree":
        entries = _read_listing(root, commit)
        wanted = sorted({entry.sha for path, entry in entries.items()
                         if entry.kind == "blob" and not hidden_from_checks(path)})
        return cls(entries, _read_blobs(root, wanted))


def _read_blobs(root: str, shas: list[str]) -> dict[str, bytes]:
    """`cat-file --batch`: "<sha> <type> <size>\\n<content>\\n" per requested object."""
    if not shas:
        return {}
    out = git(root, "cat-file", "--batch", stdin="".join(f"{sha}\n" for sha in shas)).stdout
    blobs: dict[str, bytes] = {}
    position = 0
    for sha in shas:
        line_end = out.index(b"\n", position)
        header = out[position:line_end].decode("ascii", "replace").split(" ")
        if len(header) != 3:
            raise GitFailure(f"object {sha} is missing from the repository")
        size = int(header[2])
        blobs[sha] = out[line_end + 1:line_end + 1 + size]
        position = line_end + 1 + size + 1
    return blobs


def _intents_at(root: str, commit: str, checks: list[IntegrationChild]) -> dict[str, dict[str, Any]]:
    """Each task's intent as `commit` holds it (absent or unreadable: left out), in one cat-file."""
    names = [f"{commit}:{check.intent_path}" for check in checks]
    out = git(root, "cat-file", "--batch", stdin="".join(f"{name}\n" for name in names)).stdout
    found: dict[str, dict[str, Any]] = {}
    position = 0
    for check in checks:
        line_end = out.index(b"\n", position)
        header = out[position:line_end].decode("utf-8", "replace").split(" ")
        if len(header) != 3 or header[1] != "blob":
            position = line_end + 1
            continue
        size = int(header[2])
        content = out[line_end + 1:line_end + 1 + size]
        position = line_end + 1 + size + 1
        try:
            found[check.task_id] = parse_json(content.decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            continue
    return found


def _lost_change(candidate: str, lane: str) -> IntegrationError:
    return IntegrationError(CONFLICT, f"{CONFLICT}: candidate {candidate} does not carry the lane commit {lane} change")


def _already_in(lane: str, head: str) -> IntegrationError:
    return IntegrationError(CONFLICT, f"{CONFLICT}: lane commit {lane} is already in batch head {head}; a candidate "
                                      f"would not carry the lane commit {lane} change")


def _require_lineage(current_branch: str | None, current_head: str | None, branch: str, head: str) -> None:
    if current_branch != branch:
        raise IntegrationError(LINEAGE_BROKEN, lineage_broken(
            f"current branch {current_branch or ''} does not match expected branch {branch}"))
    if current_head != head:
        raise IntegrationError(LINEAGE_BROKEN, lineage_broken(
            f"current HEAD {current_head or ''} does not match expected batch head {head}"))


def _require_valid_descriptors(intents: Iterable[tuple[str, dict[str, Any]]]) -> None:
    """Every acceptance item's verification must parse as a descriptor before anything runs."""
    from lanes_es.domain.descriptor import parse_verification_descriptor  # the domain owns descriptor v2

    count = 0
    for _, intent in intents:
        for item in intent["acceptance"]:
            count += 1
            try:
                parse_verification_descriptor(item["verification"])
            except Exception as error:  # the parser's refusal, whatever its type
                raise IntegrationError(CHECK_FAILED, f"{CHECK_FAILED}: a verification descriptor is invalid: "
                                                     f"{error}") from None
    if count == 0:
        raise IntegrationError(CHECK_FAILED, f"{CHECK_FAILED}: no descriptor to rerun")


__all__ = ["GitLanes", "StatusRead", "read_status", "parse_status_v2", "change_identities", "branch_and_head",
           "real_path", "CandidateTree", "check_failure_reason"]
