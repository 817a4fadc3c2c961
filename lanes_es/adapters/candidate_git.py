"""`GitCandidates`: the candidate builder on real git (the CandidateBuilder port:
docs/upstream.md#the-guarded-integration).

What the tick asks of git to integrate settled Lanes: the candidate (the batch head plus a lane
commit, built without touching any branch or checkout), the chain of a round's candidates, the
checks each one runs (its tree and each task's intent as the candidate holds them: what the verifier,
here or on a Ray node, runs), the guarded fast-forward of the batch branch, and a ref that keeps a
failed candidate for a person to inspect. The checks themselves run in the verifier
(check_runner.py), never here.

Every spawn costs milliseconds, so each operation is built from as few git commands as
its checks allow; the comments say which upstream calls one command stands for.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import msgspec

from lanes_es.adapters.check_runner import CheckTree, TreeEntry, run_in_turn
from lanes_es.adapters.git import batch_identity_env, cat_file_batch, git, git_ok
from lanes_es.adapters.lane_git import (
    CHECK_FAILED, CONFLICT, LINEAGE_BROKEN, LOG_META, branch_and_head, change_identities, lineage_broken,
    short_branch,
)
from lanes_es.domain.candidates import check_failure_reason
from lanes_es.domain.check_inputs import acceptance_digest, hidden_from_checks
from lanes_es.domain.jstext import parse_json
from lanes_es.ports import (
    CandidateBuild,
    CandidateCheck,
    CandidateChecks,
    CandidateVerdict,
    GitFailure,
    IntegrationChild,
    IntegrationError,
    IntegrationRequest,
    PlannedCheck,
)


class GitCandidates:
    """CandidateBuilder on real git. One instance per tick: what a round's chains learned is kept for the tick
    (commits and trees never change)."""

    _merge_tree_has_merge_base: bool | None = None  # per process: the installed git does not change

    def __init__(self) -> None:
        self._lane_facts: dict[str, LaneCommit] = {}  # lane commit -> parents, log's author and message
        self._ancestry: dict[str, tuple[str, frozenset[str]]] = {}  # built candidate -> (anchor, commits added)
        self._listings: dict[str, dict[str, TreeEntry]] = {}  # commit -> its full listing
        self._blobs: dict[str, bytes] = {}
        self._content_digests: dict[tuple[str, str], str] = {}  # (blob, mode) -> protected-input digest

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
            return short_branch(lines[-1]), lines[0], lines[1:-1]
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
    """Each blob's bytes, in one `cat-file --batch`; GitFailure when one is missing."""
    blobs: dict[str, bytes] = {}
    for sha, found in zip(shas, cat_file_batch(root, shas)):
        if found is None:
            raise GitFailure(f"object {sha} is missing from the repository")
        blobs[sha] = found[2]
    return blobs


def _intents_at(root: str, commit: str, checks: list[IntegrationChild]) -> dict[str, dict[str, Any]]:
    """Each task's intent as `commit` holds it (absent or unreadable: left out), in one cat-file."""
    found: dict[str, dict[str, Any]] = {}
    held = cat_file_batch(root, [f"{commit}:{check.intent_path}" for check in checks])
    for check, item in zip(checks, held):
        if item is None or item[1] != "blob":
            continue
        try:
            found[check.task_id] = parse_json(item[2].decode("utf-8"))
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


__all__ = ["GitCandidates", "CandidateTree", "LaneCommit"]
