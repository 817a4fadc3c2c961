"""`LocalCheckRunner`: the CheckRunner port on this machine, and the tree a check runs on.

Where a candidate's checks run is a port of its own (lanes_es/ports.py `CheckRunner`), apart from the
git work that builds the candidate (`candidate_git.GitCandidates`): what a check needs travels as values, the
candidate's tree (`CheckTree`: its entries and their bytes, read from git once by the builder) and
the task's intent, and what comes back is the check's result (`CheckRun`). This runner writes the tree
into a fresh temporary directory for each check (a check may write into its tree: no two checks share
one) and runs the task's acceptance there with the deterministic QA runner (adapters/qa.py), as a
process group that a `CheckCancel` can kill.
"""

from __future__ import annotations

import os
import tempfile
import threading
from typing import Any

import msgspec

from lanes_es.adapters.processes import tree_prefix
from lanes_es.domain.check_inputs import GITLINK, SYMLINK, hidden_from_checks, tree_identity
from lanes_es.ports import CandidateChecks, CandidateVerdict, CheckRun, GitFailure, IntegrationError, check_on

CHECK_FAILED = "batch_integration_check_failed"


class TreeEntry(msgspec.Struct, frozen=True):
    mode: str
    kind: str
    sha: str


class CheckTree:
    """A commit's full tree as a check sees it: entries and blob bytes, held in memory, `.imm/audit/` left out
    (`check_inputs`). Not `git archive`: archive applies the tree's own `export-ignore` and `export-subst`
    attributes, so a hostile `.gitattributes` could hide a sibling's file from the rerun. Written to as many
    fresh temporary directories as there are checks to run, with no worktree involved."""

    def __init__(self, entries: dict[str, TreeEntry], blobs: dict[str, bytes],
                 content_digests: dict[tuple[str, str], str] | None = None) -> None:
        self.entries = {path: entry for path, entry in entries.items() if not hidden_from_checks(path)}
        self.blobs = blobs
        self._digests: dict[str, str] | None = None
        self._identity: str | None = None
        # (blob, mode) -> digest, shareable between the candidates of a round, which hold mostly the same blobs
        self._content_digests = {} if content_digests is None else content_digests
        self._lock = threading.Lock()  # a candidate's checks ask for its digests from their own threads

    @property
    def identity(self) -> str:
        """What a check on this tree sees, as one digest (`check_inputs.tree_identity`)."""
        if self._identity is None:
            self._identity = tree_identity((path, entry.mode, entry.sha) for path, entry in self.entries.items())
        return self._identity

    def file(self, path: str, entries: dict[str, TreeEntry] | None = None) -> bytes | None:
        """The bytes of a regular file at `path`, or None (absent, a symlink, a submodule)."""
        entry = (entries if entries is not None else self.entries).get(path)
        if entry is None or entry.kind != "blob" or entry.mode not in ("100644", "100755"):
            return None
        return self.blobs.get(entry.sha)

    def input_digests(self) -> dict[str, str]:
        """The protected inputs of a tree written by `write_to`, as the QA runner reads them, computed once
        from the objects in memory so that each check's run hashes its tree only after the checks."""
        with self._lock:
            if self._digests is None:
                self._digests = {os.path.normpath(path): self._digest_of(entry)
                                 for path, entry in self.entries.items() if entry.kind == "blob"}
            return self._digests

    def _digest_of(self, entry: TreeEntry) -> str:
        from lanes_es.adapters.qa import input_digest

        if entry.mode == SYMLINK:
            return "link:" + os.fsdecode(self.blobs[entry.sha])
        key = (entry.sha, entry.mode)
        if key not in self._content_digests:
            self._content_digests[key] = input_digest(self.blobs[entry.sha], 0o755 if entry.mode == "100755" else 0o644)
        return self._content_digests[key]

    def write_to(self, directory: str) -> None:
        """Write every entry under `directory`: files with their mode, symlinks as links, submodules as empty dirs.

        Each check of a candidate gets a tree of its own (a check may write into its tree, and no copy
        on this file system is both cheaper and safe: hard links would share a check's writes), so this
        is the fixed cost per check: each directory is made once, each file with one open and one write."""
        made = {directory}
        for path, entry in self.entries.items():
            target = _safe_target(directory, path)
            parent = os.path.dirname(target)
            if parent not in made:
                os.makedirs(parent, exist_ok=True)
                made.add(parent)
            if entry.kind == "commit" or entry.mode == GITLINK:
                os.makedirs(target, exist_ok=True)
                made.add(target)
            elif entry.mode == SYMLINK:
                os.symlink(os.fsdecode(self.blobs[entry.sha]), target)
            else:
                mode = 0o755 if entry.mode == "100755" else 0o644
                handle = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
                try:
                    _write_all(handle, self.blobs[entry.sha])
                    os.fchmod(handle, mode)  # the mode as git holds it, whatever the umask
                finally:
                    os.close(handle)


class LocalCheckRunner:
    """CheckRunner here: each check on its own fresh copy of the tree, its commands process groups of this
    machine. Stateless: one instance serves every thread."""

    def run_check(self, tree: CheckTree, task_id: str, intent: dict[str, Any], cancel: Any = None) -> CheckRun:
        """One task's acceptance on a fresh copy of `tree`. A run that cannot complete is a check failure,
        never a pass (IntegrationError); one that `cancel` cut short is `cancelled`."""
        from lanes_es.adapters.qa import run_acceptance_with_outputs  # the kernel's deterministic QA

        try:
            with tempfile.TemporaryDirectory(prefix=tree_prefix("candidate"), ignore_cleanup_errors=True) as directory:
                tree.write_to(directory)
                verdict, outputs = run_acceptance_with_outputs(directory, task_id, intent, tree.input_digests(),
                                                               cancel)
        except IntegrationError:
            raise
        except Exception as error:
            raise IntegrationError(CHECK_FAILED, f"{CHECK_FAILED}: the descriptor rerun could not complete: "
                                                 f"{error}") from None
        cancelled = cancel is not None and cancel.is_set()
        if verdict.decision == "pass":
            return CheckRun(task_id=task_id, findings=[], outputs=outputs, cancelled=cancelled)
        ids = [_finding_id(task_id, finding) for finding in verdict.findings]
        return CheckRun(task_id=task_id, findings=ids or [f"{task_id}:a descriptor"], outputs=outputs,
                        cancelled=cancelled)


def run_in_turn(planned: CandidateChecks, runner: Any = None) -> CandidateVerdict:
    """A candidate's checks one after another, here (what `GitCandidates.integrate` does when the tick gives it no
    verifier of its own)."""
    runner = runner or LocalCheckRunner()
    return CandidateVerdict.of(planned.commit, [
        check_on(planned.tree_identity, item, runner.run_check(planned.tree, item.task_id, item.intent))
        for item in planned.checks])


def _finding_id(task_id: str, finding: Any) -> str:
    """Upstream names a failed item `<task_id>:<item.id>`."""
    found = finding.get("id") if isinstance(finding, dict) else getattr(finding, "id", "")
    found = str(found or "")
    return found if found.startswith(f"{task_id}:") else f"{task_id}:{found}"


def _write_all(handle: int, content: bytes) -> None:
    view = memoryview(content)
    while view:
        view = view[os.write(handle, view):]


def _safe_target(directory: str, path: str) -> str:
    """git never stores `..`, `.git` or absolute paths in a tree it made; refuse one that does."""
    parts = path.split("/")
    if path.startswith("/") or any(part in ("", ".", "..") or part.lower() == ".git" for part in parts):
        raise GitFailure(f"candidate tree holds an unsafe path {path!r}")
    return os.path.join(directory, *parts)
