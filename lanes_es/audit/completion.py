"""Upstream's lane-aware completion verifier (`verify-batch-completion`, docs/upstream.md#the-completion-verifier).

Given a completed batch, it reads the v2 state file, the report and git, and says
whether the batch branch really is what the record claims: every child's commit, in
integration order, on a single-parent line from `base_head` to HEAD (stepping over
adopted user commits), each carrying the batch trailer, the batch author, its
`imm(<task>):` subject, exactly one run's audit pair and nothing outside its scope.

The output is upstream's observation object, and each refusal carries upstream's code.
Reading is done in three git spawns whatever the number of children: one for branch
and HEAD, one `git log` for every commit with its parents, trailer, author, subject and
paths, one `git cat-file --batch` for every audit pair and intent blob.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, NoReturn

import msgspec

from lanes_es.adapters.files import FileTooLarge, read_capped
from lanes_es.adapters.git import DEFAULT_AUTHOR_NAME, git_ok
from lanes_es.domain.audit_pair import (
    AUDIT_DIR, PROOF_FILE, RECORD_FILE, normalize_tombstone, verify_pair,
)
from lanes_es.domain.ids import RECORD_CONTRACT, REPORT_CONTRACT, batch_branch_name, is_valid_id
from lanes_es.domain.intent import InvalidIntent, is_path_allowed_for_child, parse_task_intent
from lanes_es.domain.jstext import parse_json
from lanes_es.domain.record import expected_batch_head
from lanes_es.domain.validator import InvalidRecord, validate_record
from lanes_es.projections.files import MAX_DOCUMENT_BYTES, UnsafeBatchId, read_bytes, report_path, state_path

OBSERVATION_CONTRACT = "immune_brain/batch_completion_observation/v1"

STATE_REPORT_MISMATCH = "state_report_mismatch"
COMMIT_ORDER_MISMATCH = "commit_order_mismatch"
LINEAGE_MISMATCH = "lineage_mismatch"
MISSING_COMMIT_EVIDENCE = "missing_commit_evidence"
WRONG_RUN_EVIDENCE = "wrong_run_evidence"
STOPPED_LIFECYCLE = "stopped_lifecycle"
SCOPE_MISMATCH = "scope_mismatch"
MALFORMED_REPORT = "malformed_report"
UNSTABLE_EVIDENCE = "unstable_evidence"
INVALID_INPUT = "invalid_input"
READ_FAILED = "read_failed"

# Upstream's exit status: 2 when the input could not be read as what it should be, 1 for a contradiction.
EXIT_TWO_CODES = frozenset({INVALID_INPUT, READ_FAILED, MALFORMED_REPORT})

# The verifier requires upstream's minted form, run-<uuid>.
VERIFIER_RUN_ID = re.compile(r"^run-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
TRAILER_KEY = "Immune-Brain-Batch"
_COMMIT_ID = re.compile(r"^([0-9a-f]{40}|[0-9a-f]{64})$")
_RECORD_START = re.compile(r"^\x1e([0-9a-f]{40}|[0-9a-f]{64})$")
_LOG_FORMAT = f"--format=%x1e%H%x00%P%x00%an%x00%ae%x00%(trailers:key={TRAILER_KEY},valueonly)%x00%s%x00"


class CompletionChild(msgspec.Struct, frozen=True, kw_only=True):
    task_id: str
    run_id: str
    commit: str
    parent: str


class CompletionObservation(msgspec.Struct, kw_only=True):
    batch_id: str
    complete: bool
    batch_state: str | None
    report_state: str | None
    children: list[CompletionChild]
    code: str | None
    message: str = ""  # what a person needs to act; not part of upstream's object
    note: str = ""  # how the batch branch was found, when not as itself (deleted after landing)

    def as_json(self) -> dict[str, Any]:
        """Upstream's observation object, key for key."""
        return {
            "contract": OBSERVATION_CONTRACT, "batch_id": self.batch_id, "complete": self.complete,
            "batch_state": self.batch_state, "report_state": self.report_state,
            "children": [msgspec.to_builtins(child) for child in self.children], "code": self.code,
        }

    @property
    def exit_code(self) -> int:
        if self.complete:
            return 0
        return 2 if self.code in EXIT_TWO_CODES else 1


class Refused(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


@dataclass
class _Seen:
    """What was read, kept to check at the end that nothing moved while the verifier looked."""

    batch_state: str | None = None
    report_state: str | None = None
    state_bytes: bytes | None = None
    report_bytes: bytes | None = None
    head_line: str = ""
    note: str = ""
    checkout_is_batch_head: bool = False  # the checkout's files are then compared with the committed ones too
    worktree_files: dict[str, bytes | None] = field(default_factory=dict)


def verify_completion(root: str | Path, batch_id: str, author_name: str | None = None) -> CompletionObservation:
    """Upstream's completion verification of `batch_id` in the checkout at `root`. Writes nothing."""
    seen = _Seen()
    try:
        children = _verify(str(root), batch_id, author_name or os.environ.get("GIT_AUTHOR_NAME") or DEFAULT_AUTHOR_NAME,
                           seen)
        _check_stable(str(root), batch_id, seen)
    except Refused as refusal:
        return CompletionObservation(batch_id=batch_id, complete=False, batch_state=seen.batch_state,
                                     report_state=seen.report_state, children=[], code=refusal.code,
                                     message=refusal.message)
    return CompletionObservation(batch_id=batch_id, complete=True, batch_state=seen.batch_state,
                                 report_state=seen.report_state, children=children, code=None,
                                 message=f"batch {batch_id} is complete: {len(children)} children verified",
                                 note=seen.note)


def _verify(root: str, batch_id: str, author: str, seen: _Seen) -> list[CompletionChild]:
    state, report = _read_documents(root, batch_id, seen)
    _check_agreement(batch_id, state, report)
    _check_commit_sets(state)
    head = _check_branch_and_head(root, state, seen)
    chain = _first_parent_line(root, state["base_head"], head)
    return _walk(root, batch_id, author, state, chain, seen)


# ---------------------------------------------------------------- the two documents


def _read_documents(root: str, batch_id: str, seen: _Seen) -> tuple[dict[str, Any], dict[str, Any]]:
    if not is_valid_id(batch_id):
        raise Refused(INVALID_INPUT, f"{batch_id!r} is not a batch id")
    try:
        paths = state_path(root, batch_id), report_path(root, batch_id)
    except UnsafeBatchId as error:
        raise Refused(INVALID_INPUT, str(error)) from None
    seen.state_bytes = _read(paths[0], "state file")
    seen.report_bytes = _read(paths[1], "report")
    state = _parse(seen.state_bytes, paths[0], "state file")
    if state.get("contract") != RECORD_CONTRACT:
        raise Refused(READ_FAILED, f"{paths[0]} is not a lane batch record ({RECORD_CONTRACT})")
    seen.batch_state = state.get("batch_state") if isinstance(state.get("batch_state"), str) else None
    try:
        validate_record(state, batch_id)
    except InvalidRecord as error:
        raise Refused(STATE_REPORT_MISMATCH, f"the state file contradicts itself: {error}") from None
    report = _parse(seen.report_bytes, paths[1], "report")
    seen.report_state = report.get("batch_state") if isinstance(report.get("batch_state"), str) else None
    _check_report_shape(report)
    return state, report


def _read(path: Path, what: str) -> bytes:
    try:
        data = read_bytes(path)
    except OSError as error:
        raise Refused(READ_FAILED, f"cannot read the {what} {path}: {error.strerror or error}") from None
    if data is None:
        raise Refused(READ_FAILED, f"the {what} {path} does not exist")
    if len(data) > MAX_DOCUMENT_BYTES:
        raise Refused(READ_FAILED, f"the {what} {path} is larger than {MAX_DOCUMENT_BYTES} bytes, which no batch's "
                                   f"{what} is")
    return data


def _parse(data: bytes, path: Path, what: str) -> dict[str, Any]:
    try:
        value = parse_json(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise Refused(READ_FAILED, f"the {what} {path} is not JSON: {error}") from None
    if not isinstance(value, dict):
        raise Refused(READ_FAILED if what == "state file" else MALFORMED_REPORT, f"the {what} {path} is not an object")
    return value


def _check_report_shape(report: dict[str, Any]) -> None:
    if report.get("contract") != REPORT_CONTRACT:
        raise Refused(MALFORMED_REPORT, f"the report's contract is not {REPORT_CONTRACT}")
    if "handoff" in report:
        raise Refused(MALFORMED_REPORT, "a lane report never carries the serial handoff field")
    if not isinstance(report.get("handoffs"), list):
        raise Refused(MALFORMED_REPORT, "the report has no handoffs list")
    max_parallel = report.get("max_parallel")
    if isinstance(max_parallel, bool) or not isinstance(max_parallel, (int, float)):
        raise Refused(MALFORMED_REPORT, "the report has no numeric max_parallel")
    if not isinstance(report.get("children"), list) or not isinstance(report.get("commits"), list):
        raise Refused(MALFORMED_REPORT, "the report has no children or commits list")


def _child_view(child: Any) -> Any:
    if not isinstance(child, dict):
        return child
    return {key: child.get(key) for key in ("task_id", "slice_id", "blocked_by", "state", "commit")}


def _check_agreement(batch_id: str, state: dict[str, Any], report: dict[str, Any]) -> None:
    if state["batch_state"] != "completed":
        raise Refused(STATE_REPORT_MISMATCH, f"the state of {batch_id} is {state['batch_state']}, not completed")
    if report.get("batch_state") != "completed":
        raise Refused(STATE_REPORT_MISMATCH, f"the report of {batch_id} is {report.get('batch_state')}, not completed")
    if report.get("batch_id") != batch_id or report.get("initiative_slug") != state["initiative_slug"]:
        raise Refused(STATE_REPORT_MISMATCH, "the report names another batch or Initiative than the state")
    if [_child_view(child) for child in report["children"]] != [_child_view(child) for child in state["children"]]:
        raise Refused(STATE_REPORT_MISMATCH, "the report's children differ from the state's")
    if report["commits"] != state["commits"]:
        raise Refused(STATE_REPORT_MISMATCH, "the report's commits differ from the state's")
    if report["max_parallel"] != state["max_parallel"]:
        raise Refused(STATE_REPORT_MISMATCH,
                      f"the report's max_parallel {report['max_parallel']} differs from the state's {state['max_parallel']}")


def _check_commit_sets(state: dict[str, Any]) -> None:
    commits = state["commits"]
    for child in state["children"]:
        if child["state"] not in ("integrated", "released") or not child["commit"]:
            raise Refused(COMMIT_ORDER_MISMATCH, f"child {child['task_id']} is {child['state']} without a commit")
    if len(set(commits)) != len(commits):
        raise Refused(COMMIT_ORDER_MISMATCH, "a commit appears twice in commits")
    if sorted(child["commit"] for child in state["children"]) != sorted(commits):
        raise Refused(COMMIT_ORDER_MISMATCH, "the children's commits and the commits list are not the same set")


# ---------------------------------------------------------------- git


def _check_branch_and_head(root: str, state: dict[str, Any], seen: _Seen) -> str:
    """The head of the batch branch itself, whichever branch the checkout is on (upstream reads HEAD and needs
    the batch branch checked out: docs/upstream.md#the-completion-verifier). A branch deleted after landing is
    judged by its recorded head, when the repository still has that commit."""
    branch = state.get("branch") or batch_branch_name(state["initiative_slug"])
    expected = expected_batch_head(state)
    if _COMMIT_ID.fullmatch(str(expected)) is None or "\n" in branch:
        raise Refused(LINEAGE_MISMATCH, f"the recorded batch head {expected!r} is not a commit id")
    seen.head_line = _branch_heads(root, branch, expected)
    tip, recorded, checked_out = seen.head_line.split("\n")
    seen.checkout_is_batch_head = bool(checked_out) and checked_out == (tip or recorded)
    if tip:
        if tip != expected:
            raise Refused(LINEAGE_MISMATCH, f"HEAD {tip} of the batch branch {branch} is not the expected batch "
                                            f"head {expected}")
        return tip
    if not recorded:
        raise Refused(LINEAGE_MISMATCH, f"the batch branch {branch} is not in {root}, nor its recorded head "
                                        f"{expected}; verify in the repository that ran the batch")
    seen.note = f"the batch branch {branch} is gone (landed and deleted?); its recorded head {expected[:12]} was judged"
    return expected


def _branch_heads(root: str, branch: str, expected: str) -> str:
    """Three lines: the batch branch's commit (empty when there is no such branch), the recorded head's (empty
    when the repository lacks it) and HEAD's, in one spawn; names on stdin never reach git as options."""
    asked = f"refs/heads/{branch}^{{commit}}\n{expected}^{{commit}}\nHEAD^{{commit}}\n"
    result = git_ok(root, "cat-file", "--batch-check=%(objectname)", stdin=asked.encode())
    if result.exit_code != 0:
        raise Refused(LINEAGE_MISMATCH, f"the batch branch {branch} of {root} is unreadable: {result.error_text}")
    lines = (result.stdout.decode("utf-8", "replace").splitlines() + ["", "", ""])[:3]
    return "\n".join("" if line.endswith(" missing") or line.endswith(" ambiguous") else line for line in lines)


@dataclass(frozen=True)
class _Commit:
    sha: str
    parents: tuple[str, ...]
    author_name: str
    author_email: str
    trailer: str
    subject: str
    paths: tuple[str, ...]


def _first_parent_line(root: str, base_head: str, head: str) -> list[_Commit]:
    """Every commit from just after `base_head` to `head`, oldest first, with the paths each changed."""
    if _COMMIT_ID.fullmatch(base_head) is None:  # also keeps a hostile record from passing git an option
        raise Refused(LINEAGE_MISMATCH, f"base_head {base_head!r} is not a commit id")
    result = git_ok(root, "log", "--first-parent", "--ancestry-path", "--reverse", "--no-renames", "-z",
                    "--name-only", _LOG_FORMAT, f"{base_head}..{head}", "--")
    if result.exit_code != 0:
        raise Refused(LINEAGE_MISMATCH, f"the line from base_head {base_head} to HEAD is unreadable: "
                                        f"{result.error_text}")
    return list(_parse_log(result.stdout.decode("utf-8", "surrogateescape")))


def _parse_log(output: str) -> Iterator[_Commit]:
    """Tokens split on NUL: a record starts with \\x1e<sha>, then five fields, then its paths."""
    tokens = output.split("\0")
    index = 0
    while index < len(tokens):
        start = _RECORD_START.match(tokens[index].lstrip("\n"))
        if start is None:
            index += 1
            continue
        fields = tokens[index + 1:index + 6]
        index += 6
        paths: list[str] = []
        while index < len(tokens) and _RECORD_START.match(tokens[index].lstrip("\n")) is None:
            token = tokens[index]
            if token:
                paths.append(token[1:] if not paths and token.startswith("\n") else token)
            index += 1
        parents, name, email, trailer, subject = (fields + [""] * 5)[:5]
        yield _Commit(sha=start.group(1), parents=tuple(parents.split()), author_name=name, author_email=email,
                      trailer=trailer, subject=subject, paths=tuple(paths))


def _cat_blobs(root: str, specs: list[str]) -> dict[str, bytes | None]:
    """`<commit>:<path>` -> blob bytes (None when missing), in one `git cat-file --batch`."""
    if not specs:
        return {}
    result = git_ok(root, "cat-file", "--batch", stdin="".join(f"{spec}\n" for spec in specs).encode())
    if result.exit_code != 0:
        raise Refused(READ_FAILED, f"git cat-file failed: {result.error_text}")
    try:
        return _parse_batch_output(result.stdout, specs)
    except ValueError:
        raise Refused(READ_FAILED, "git cat-file printed something that is not its batch output") from None


def _parse_batch_output(data: bytes, specs: list[str]) -> dict[str, bytes | None]:
    """`<oid> blob <size>\\n<bytes>\\n` per found object, `<spec> missing\\n` otherwise, in request order."""
    blobs: dict[str, bytes | None] = {}
    offset = 0
    for spec in specs:
        end = data.index(b"\n", offset)
        header = data[offset:end].split(b" ")
        offset = end + 1
        if len(header) == 3 and header[1] == b"blob":
            size = int(header[2])
            blobs[spec] = data[offset:offset + size]
            offset += size + 1
        else:  # "<spec> missing", or not a blob
            if len(header) == 3 and header[2].isdigit():
                offset += int(header[2]) + 1
            blobs[spec] = None
    return blobs


# ---------------------------------------------------------------- the walk


@dataclass(frozen=True)
class _Step:
    task_id: str
    commit: _Commit
    parent: str
    run_id: str
    record_path: str
    proof_path: str
    intent_spec: str


def _walk(root: str, batch_id: str, author: str, state: dict[str, Any], chain: list[_Commit],
          seen: _Seen) -> list[CompletionChild]:
    """Each child commit in integration order: its place on the line, then its own evidence."""
    steps = _place_commits(batch_id, author, state, chain)
    specs: list[str] = []
    for step in steps:
        specs.extend([f"{step.commit.sha}:{step.record_path}", f"{step.commit.sha}:{step.proof_path}",
                      step.intent_spec])
    blobs = _cat_blobs(root, specs)
    children: list[CompletionChild] = []
    for step in steps:
        _check_pair(root, step, blobs, seen)
        _check_scope(step, blobs)
        children.append(CompletionChild(task_id=step.task_id, run_id=step.run_id, commit=step.commit.sha,
                                        parent=step.parent))
    return children


def _follow(head: str, adoptions: list[dict[str, str]]) -> str:
    """The head after the user fast-forwards recorded from it (the fold of `expected_batch_head`)."""
    for adopted in adoptions:
        if adopted["from"] == head:
            head = adopted["to"]
    return head


def _place_commits(batch_id: str, author: str, state: dict[str, Any], chain: list[_Commit]) -> list[_Step]:
    position = {commit.sha: index for index, commit in enumerate(chain)}
    commits: list[str] = state["commits"]
    for commit in commits:
        if commit not in position:
            raise Refused(LINEAGE_MISMATCH, f"recorded commit {commit} is not on the first-parent line from "
                                            f"base_head {state['base_head']} to HEAD")
    task_of = {child["commit"]: child for child in state["children"]}
    adoptions = state.get("adopted_heads") or []
    head = state["base_head"]
    following = _follow(head, adoptions)  # user commits adopted before the first child
    cursor = _skip_adopted(head, following, position, 0)
    head = following
    steps: list[_Step] = []
    for expected in commits:
        found = chain[cursor] if cursor < len(chain) else None
        if found is None or found.sha != expected:
            _refuse_out_of_place(found, expected, task_of)
        child = task_of[expected]
        steps.append(_step_of(batch_id, author, child, found, head, state.get("intent_identities") or {}))
        cursor += 1
        following = _follow(found.sha, adoptions)
        cursor = _skip_adopted(found.sha, following, position, cursor)
        head = following
    return steps


def _skip_adopted(head: str, following: str, position: dict[str, int], cursor: int) -> int:
    """Step over the user commits of an adoption from `head` to `following`."""
    if following == head:
        return cursor
    if following not in position or position[following] < cursor:
        raise Refused(LINEAGE_MISMATCH, f"the adoption from {head} to {following} does not move forward on the "
                                        f"batch branch")
    return position[following] + 1


def _refuse_out_of_place(found: _Commit | None, expected: str, task_of: dict[str, dict[str, Any]]) -> NoReturn:
    if found is None:
        raise Refused(LINEAGE_MISMATCH, f"recorded commit {expected} is not where the integration order puts it")
    if found.sha in task_of:
        raise Refused(COMMIT_ORDER_MISMATCH,
                      f"commit {found.sha} of {task_of[found.sha]['task_id']} comes before {expected} of "
                      f"{task_of[expected]['task_id']}, against the recorded integration order")
    raise Refused(MISSING_COMMIT_EVIDENCE, f"commit {found.sha} on the batch branch is neither a recorded child "
                                           f"commit nor an adopted user commit")


def _step_of(batch_id: str, author: str, child: dict[str, Any], commit: _Commit, head: str,
             identities: dict[str, Any]) -> _Step:
    task = child["task_id"]
    if commit.trailer.strip() != batch_id:
        raise Refused(MISSING_COMMIT_EVIDENCE, f"commit {commit.sha} of {task} does not carry "
                                               f"'{TRAILER_KEY}: {batch_id}'")
    if commit.author_name != author:
        raise Refused(MISSING_COMMIT_EVIDENCE, f"commit {commit.sha} of {task} is authored by "
                                               f"{commit.author_name!r}, not {author!r}")
    if not commit.subject.startswith(f"imm({task}):"):
        raise Refused(MISSING_COMMIT_EVIDENCE, f"commit {commit.sha} of {task} does not start 'imm({task}):'")
    if commit.parents != (head,):
        raise Refused(LINEAGE_MISMATCH, f"commit {commit.sha} of {task} has parents {list(commit.parents)}; "
                                        f"expected the single parent {head}")
    run_id = _audit_run(task, commit)
    lane_run = (child.get("lane") or {}).get("run_id")
    if lane_run and lane_run != run_id:
        raise Refused(WRONG_RUN_EVIDENCE, f"commit {commit.sha} carries the audit pair of {run_id}, but {task} "
                                          f"ran as {lane_run}")
    directory = f"{AUDIT_DIR}/{task}/{run_id}"
    return _Step(task_id=task, commit=commit, parent=head, run_id=run_id, record_path=f"{directory}/{RECORD_FILE}",
                 proof_path=f"{directory}/{PROOF_FILE}", intent_spec=f"{commit.sha}:{_intent_path(identities, task)}")


def _audit_run(task: str, commit: _Commit) -> str:
    """The one run whose audit pair the commit changes."""
    prefix = f"{AUDIT_DIR}/{task}/"
    runs: dict[str, set[str]] = {}
    for path in commit.paths:
        if path.startswith(prefix) and path.count("/") == prefix.count("/") + 1:
            run, _, name = path[len(prefix):].partition("/")
            runs.setdefault(run, set()).add(name)
    if not runs:
        raise Refused(MISSING_COMMIT_EVIDENCE, f"commit {commit.sha} of {task} carries no audit pair under {prefix}")
    if len(runs) > 1:
        raise Refused(WRONG_RUN_EVIDENCE, f"commit {commit.sha} of {task} changes the audit pairs of several runs: "
                                          f"{', '.join(sorted(runs))}")
    run, names = next(iter(runs.items()))
    if not {RECORD_FILE, PROOF_FILE} <= names:
        raise Refused(WRONG_RUN_EVIDENCE, f"commit {commit.sha} of {task} changes only half of the audit pair of {run}")
    if VERIFIER_RUN_ID.fullmatch(run) is None:
        raise Refused(WRONG_RUN_EVIDENCE, f"commit {commit.sha} of {task}: {run} is not a run-<uuid> run id")
    return run


_INTENT_PATHS = ("docs/plans/{task}.intent.json", "docs/plans/archive/{task}.intent.json")


def _intent_path(identities: dict[str, Any], task: str) -> str:
    """The recorded intent path of `task`, else its active path; only the two paths an intent may have."""
    allowed = [pattern.format(task=task) for pattern in _INTENT_PATHS]
    identity = identities.get(task)
    recorded = identity.get("intent_path") if isinstance(identity, dict) else None
    if recorded is None:
        return allowed[0]
    if recorded not in allowed:
        raise Refused(SCOPE_MISMATCH, f"the recorded intent path {recorded!r} of {task} is not one of {allowed}")
    return recorded


def _check_pair(root: str, step: _Step, blobs: dict[str, bytes | None], seen: _Seen) -> None:
    record = blobs.get(f"{step.commit.sha}:{step.record_path}")
    proof = blobs.get(f"{step.commit.sha}:{step.proof_path}")
    if record is None or proof is None:
        raise Refused(WRONG_RUN_EVIDENCE, f"the audit pair of {step.task_id} is not in commit {step.commit.sha}")
    if _is_stopped(record, proof):
        raise Refused(STOPPED_LIFECYCLE, f"{step.task_id} ended stopped in {step.run_id}, not done")
    problem = verify_pair(step.task_id, record, proof)
    if problem is not None:
        raise Refused(WRONG_RUN_EVIDENCE, f"the audit pair of {step.task_id} in {step.run_id}: {problem}")
    for path, committed in ((step.record_path, record), (step.proof_path, proof)):
        if not seen.checkout_is_batch_head:
            break  # another branch is checked out (main, to land the batch): its files are not the batch's
        on_disk = _worktree_bytes(root, path)
        seen.worktree_files[path] = on_disk
        if on_disk != committed:
            raise Refused(WRONG_RUN_EVIDENCE, f"{path} in the checkout differs from the committed one")


def _is_stopped(record: bytes, proof: bytes) -> bool:
    try:
        record_value = parse_json(record.decode("utf-8"))
        proof_value = parse_json(proof.decode("utf-8"))
    except ValueError:  # UnicodeDecodeError and nesting too deep among them
        return False  # not JSON: verify_pair names that
    lifecycle = normalize_tombstone(proof_value).get("terminal_lifecycle") if isinstance(proof_value, dict) else None
    return lifecycle == "stopped" or (isinstance(record_value, dict) and record_value.get("lifecycle") == "stopped")


def _worktree_bytes(root: str, path: str) -> bytes | None:
    target = Path(root) / path
    if target.is_symlink() or not target.is_file():
        return None  # a symlink is not the committed file, whatever it points at
    try:
        return read_capped(target, MAX_DOCUMENT_BYTES)
    except (OSError, FileTooLarge):  # larger than any audit file: it is not the committed one either
        return None


def _check_scope(step: _Step, blobs: dict[str, bytes | None]) -> None:
    data = blobs.get(step.intent_spec)
    if data is None:
        raise Refused(SCOPE_MISMATCH, f"the intent of {step.task_id} is not in commit {step.commit.sha}, so its "
                                      f"scope cannot be checked")
    try:
        intent = parse_task_intent(parse_json(data.decode("utf-8")))
    except (UnicodeDecodeError, ValueError, InvalidIntent) as error:
        raise Refused(SCOPE_MISMATCH, f"the intent of {step.task_id} in {step.commit.sha} is invalid: {error}") from None
    if intent["task_id"] != step.task_id:
        raise Refused(SCOPE_MISMATCH, f"the intent at {step.intent_spec} names {intent['task_id']}")
    outside = [path for path in step.commit.paths
               if not is_path_allowed_for_child(path, step.task_id, intent["scope_hint"])]
    if outside:
        raise Refused(SCOPE_MISMATCH, f"commit {step.commit.sha} of {step.task_id} changes paths outside its scope: "
                                      f"{', '.join(outside[:5])}")


# ---------------------------------------------------------------- stability


def _check_stable(root: str, batch_id: str, seen: _Seen) -> None:
    """Re-read what the verdict rests on; a change while verifying makes the verdict worthless."""
    moved: list[str] = []
    if read_bytes(state_path(root, batch_id)) != seen.state_bytes:
        moved.append("the state file")
    if read_bytes(report_path(root, batch_id)) != seen.report_bytes:
        moved.append("the report")
    for path, before in seen.worktree_files.items():
        if _worktree_bytes(root, path) != before:
            moved.append(path)
    state = json.loads(seen.state_bytes or b"{}")
    branch = state.get("branch") or batch_branch_name(state.get("initiative_slug", ""))
    if _branch_heads(root, branch, expected_batch_head(state)) != seen.head_line:
        moved.append("the batch branch")
    if moved:
        raise Refused(UNSTABLE_EVIDENCE, f"{', '.join(moved)} changed while the batch was being verified")
