"""Deterministic QA: run a task's acceptance descriptors on a tree and give a verdict.

docs/upstream.md#the-descriptor-rerun-and-deterministic-qa: descriptors are grouped by environment; per group a temporary
HOME is made, `prepare` runs first, then each command, with no shell, in its own process
group (killed on timeout or when its output passes the limit), with an environment limited
to PATH, HOME, TMPDIR, XDG_CACHE_HOME and IMM_VERIFICATION_PROCESS_TOKEN. A check fails on a
non-zero exit, a timeout or output over the limit; a descriptor that cannot be parsed or an
executable that cannot be found is a failure with its reason, never a pass.

Used by the reference kernel on a copy of a Lane's working tree, and by the guarded
integration on a materialized candidate tree. Repository content is hostile: a `./file`
executable and the cwd must resolve inside the tree, symlinks included.
"""

from __future__ import annotations

import os
import secrets
import selectors
import shutil
import subprocess
import tempfile
import time
from contextlib import contextmanager
from typing import Any, Iterator

import msgspec

from lanes_es.adapters.git import git
from lanes_es.domain.check_inputs import EXECUTABLE, REGULAR, SYMLINK, blob_id, hidden_from_checks, tree_identity
from lanes_es.domain.descriptor import CommandSpec, parse_verification_descriptor
from lanes_es.domain.events import OUTPUT_TAIL_LIMIT, PASSING_TAIL_LIMIT, CommandDigest
from lanes_es.domain.ids import format_timestamp
from lanes_es.adapters.processes import Captured, kill_group, start_check, tree_prefix
from lanes_es.ports import Cancel

VERDICT_CONTRACT = "assurance_kernel/assurance_verdict/v2"
OUTPUT_TAIL_BYTES = 400
READ_CHUNK = 65536
IDLE_POLL_SECONDS = 0.1
CANCELLED = "cancelled: a candidate it stood on failed"


class CheckError(Exception):
    """A check that cannot run (missing or escaping executable); the message is its finding."""


class Finding(msgspec.Struct, frozen=True, kw_only=True):
    """One failed acceptance item: `<task_id>:<item.id>` and why it failed."""

    id: str
    reason: str


class Verdict(msgspec.Struct, frozen=True, kw_only=True):
    contract: str = VERDICT_CONTRACT
    decision: str  # pass | rework
    findings: list[Finding] = []

    @property
    def passed(self) -> bool:
        return self.decision == "pass"


class Check(msgspec.Struct, frozen=True, kw_only=True):
    """A parsed acceptance item: its finding id, its command and its environment."""

    id: str
    command: CommandSpec
    prepare: CommandSpec | None
    environment_key: str
    writable_paths: tuple[str, ...] = ()


def _kill_quietly(process: subprocess.Popen[bytes]) -> None:
    import signal

    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class QaRun(msgspec.Struct, frozen=True, kw_only=True):
    """A Lane's QA: upstream's verdict, each item's command facts, and the identity of the tree it saw."""

    verdict: Verdict
    outputs: list[CommandDigest]
    tree: str


# ---------------------------------------------------------------- public


def run_acceptance(tree_dir: str, task_id: str, intent: dict[str, Any],
                   inputs: dict[str, str] | None = None) -> Verdict:
    """Run every acceptance item of `intent` on `tree_dir`; `pass` only when each one passed.

    `inputs`, when the caller wrote the tree and so knows it, is what `_protected_inputs` would read
    before the first group (path -> digest): the tree is then hashed once, after the checks, not twice."""
    return run_acceptance_with_outputs(tree_dir, task_id, intent, inputs)[0]


def run_acceptance_with_outputs(tree_dir: str, task_id: str, intent: dict[str, Any],
                                inputs: dict[str, str] | None = None, cancel: Cancel | None = None
                                ) -> tuple[Verdict, list[CommandDigest]]:
    """`run_acceptance`, with each item's command facts (in item order) for the audit log: its output's
    digest and tail, its failure reason, when it started and how long it ran.

    The digests are kept beside the verdict, not in it: the verdict is upstream's
    `assurance_verdict/v2` document, which has no place for them. With `cancel` set, the running command is
    killed and the items not yet run fail as cancelled."""
    items = intent.get("acceptance") if isinstance(intent, dict) else None
    if not isinstance(items, list) or not items:
        return Verdict(decision="rework", findings=[Finding(id=f"{task_id}:*", reason="no acceptance item to check")]), []
    failures: dict[str, str] = {}
    outputs: dict[str, Output] = {}
    checks: list[Check] = []
    order: list[str] = []
    for item in items:
        finding_id = f"{task_id}:{_item_id(item)}"
        order.append(finding_id)
        try:
            checks.append(_check(finding_id, item))
        except ValueError as error:  # InvalidDescriptor, or an item without a verification: a failure
            failures[finding_id] = str(error)
    for index, group in enumerate(_groups(checks)):
        failures.update(_run_group(os.path.realpath(tree_dir), group, inputs if index == 0 else None, outputs,
                                   cancel))
    findings = [Finding(id=finding_id, reason=failures[finding_id]) for finding_id in order if finding_id in failures]
    digests = [_digest(finding_id, failures.get(finding_id), outputs.get(finding_id)) for finding_id in order]
    return Verdict(decision="rework" if findings else "pass", findings=findings), digests


def _digest(finding_id: str, failure: str | None, output: "Output | None") -> CommandDigest:
    """One item's facts for the log; `failure` is its finding's reason (None: it passed)."""
    if output is None:
        return CommandDigest(id=finding_id, passed=failure is None, reason=failure)
    return CommandDigest(id=finding_id, passed=failure is None, output_sha256=output.sha256, output_bytes=output.size,
                         reason=output.reason if failure is not None else None,
                         output_tail=output.tail_text(OUTPUT_TAIL_LIMIT if failure is not None else PASSING_TAIL_LIMIT),
                         started_at=output.started_at, duration_ms=output.duration_ms)


def run_acceptance_on_worktree(worktree: str, task_id: str, intent: dict[str, Any]) -> Verdict:
    """`run_acceptance` on a copy of `worktree`'s tracked and untracked (not ignored) files.

    A copy, as upstream's temporary clone: the commands cannot dirty the Lane (build output
    would otherwise leak into the lane commit) nor alter the work they judge.
    """
    return run_acceptance_on_worktree_with_outputs(worktree, task_id, intent)[0]


def run_acceptance_on_worktree_with_outputs(worktree: str, task_id: str, intent: dict[str, Any]
                                            ) -> tuple[Verdict, list[CommandDigest]]:
    run = run_qa_on_worktree(worktree, task_id, intent)
    return run.verdict, run.outputs


def run_qa_on_worktree(worktree: str, task_id: str, intent: dict[str, Any]) -> QaRun:
    """The Lane's QA on a copy of its delivery, with the identity of the tree the checks saw."""
    with materialized_tree(worktree) as (copy, identity):
        verdict, outputs = run_acceptance_with_outputs(copy, task_id, intent)
    return QaRun(verdict=verdict, outputs=outputs, tree=identity)


@contextmanager
def materialized_worktree(worktree: str) -> Iterator[str]:
    """A temporary directory holding what `git ls-files -co --exclude-standard` lists in `worktree`."""
    with materialized_tree(worktree) as (copy, _):
        yield copy


@contextmanager
def materialized_tree(worktree: str) -> Iterator[tuple[str, str]]:
    """`materialized_worktree`, and the identity of the tree it holds (`check_inputs.tree_identity`).

    The copy is what a candidate's check sees of the same commit: files with git's modes (0644, or 0755
    when executable, whatever the worktree's other bits), symlinks as links, and nothing of `.imm/audit/`."""
    listed = git(worktree, "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--")
    target = tempfile.mkdtemp(prefix=tree_prefix("qa-tree"))
    entries: list[tuple[str, str, str]] = []
    try:
        for path in dict.fromkeys(part for part in listed.stdout.decode("utf-8", "surrogateescape").split("\0")
                                  if part):
            if hidden_from_checks(path):
                continue
            entry = _copy_entry(os.path.join(worktree, path), os.path.join(target, path))
            if entry is not None:
                entries.append((path, *entry))
        yield target, tree_identity(entries)
    finally:
        shutil.rmtree(target, ignore_errors=True)


# ---------------------------------------------------------------- parsing


def _item_id(item: Any) -> str:
    return str(item.get("id")) if isinstance(item, dict) else "?"


def _check(finding_id: str, item: Any) -> Check:
    if not isinstance(item, dict) or "verification" not in item:
        raise ValueError("acceptance item has no verification")
    descriptor = parse_verification_descriptor(item["verification"])
    environment = descriptor.environment
    return Check(id=finding_id, command=descriptor.command, prepare=environment.prepare,
                 environment_key=msgspec.json.encode(environment, order="sorted").decode(),
                 writable_paths=tuple(environment.writable_paths))


def _groups(checks: list[Check]) -> list[list[Check]]:
    """Checks grouped by environment, groups in order of first appearance."""
    groups: dict[str, list[Check]] = {}
    for check in checks:
        groups.setdefault(check.environment_key, []).append(check)
    return list(groups.values())


# ---------------------------------------------------------------- running


def _run_group(tree: str, group: list[Check], inputs: dict[str, str] | None = None,
               outputs: dict[str, Output] | None = None, cancel: Cancel | None = None) -> dict[str, str]:
    """Failures of one environment group: prepare first (its failure fails the whole group), then each check;
    afterwards the protected inputs (every file the tree held outside the group's writable paths) must be
    as they were, the `./` executables among them."""
    writable = group[0].writable_paths
    before = (_protected_inputs(tree, writable) if inputs is None
              else {path: held for path, held in inputs.items() if not _is_writable(path, writable)})
    with _sandbox_env() as env:
        prepare = group[0].prepare
        if prepare is not None:
            reason = run_command(tree, prepare, env, cancel=cancel)
            if reason is not None:
                return {check.id: f"environment prepare failed: {reason}" for check in group}
        failures = {}
        for check in group:
            if cancel is not None and cancel.is_set():
                failures[check.id] = CANCELLED
                continue
            output = Output()
            reason = run_command(tree, check.command, env, output, cancel=cancel)
            if outputs is not None and output.started:
                outputs[check.id] = output
            if reason is not None:
                failures[check.id] = reason
        if cancel is not None and cancel.is_set():
            return {check.id: failures.get(check.id, CANCELLED) for check in group}
    changed = _changed(before, _protected_inputs(tree, writable))
    if changed:
        # Which check wrote is unknown: a verdict on inputs the checks themselves altered proves nothing.
        reason = f"the checks changed protected inputs outside the writable paths: {', '.join(changed[:5])}" + (
            f" and {len(changed) - 5} more" if len(changed) > 5 else "")
        return {check.id: failures.get(check.id, reason) for check in group}
    return failures


def _protected_inputs(tree: str, writable: tuple[str, ...]) -> dict[str, str]:
    """Every file and link in the tree outside the writable paths, with what it holds."""
    found: dict[str, str] = {}
    for directory, dirnames, filenames in os.walk(tree):
        relative_dir = os.path.relpath(directory, tree)
        dirnames[:] = [name for name in dirnames
                       if not _is_writable(os.path.normpath(os.path.join(relative_dir, name)), writable)]
        # A symlink to a directory is listed among the directories (and not followed): it is an input
        # like any other link, held by its target (the candidate's tree counts it so too).
        links = [name for name in dirnames if os.path.islink(os.path.join(directory, name))]
        dirnames[:] = [name for name in dirnames if name not in links]
        for name in [*filenames, *links]:
            relative = os.path.normpath(os.path.join(relative_dir, name))
            if _is_writable(relative, writable):
                continue
            path = os.path.join(directory, name)
            found[relative] = "link:" + os.readlink(path) if os.path.islink(path) else _digest_of(path)
    return found


def _is_writable(relative: str, writable: tuple[str, ...]) -> bool:
    return any(relative == entry or relative.startswith(entry.rstrip("/") + "/") for entry in writable)


def input_digest(content: bytes, mode: int) -> str:
    """What `_protected_inputs` reads for a regular file holding `content` with permission bits `mode`."""
    import hashlib

    return hashlib.sha256(content).hexdigest() + f":{mode & 0o777:o}"


def _digest_of(path: str) -> str:
    import hashlib

    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(READ_CHUNK), b""):
                digest.update(chunk)
    except OSError as error:
        return f"unreadable:{error.errno}"
    return digest.hexdigest() + f":{os.stat(path).st_mode & 0o777:o}"


def _changed(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """Inputs that were altered or removed; new files (build output, flags) are not inputs."""
    return sorted(path for path, held in before.items() if after.get(path) != held)


@contextmanager
def _sandbox_env() -> Iterator[dict[str, str]]:
    """The only environment a descriptor sees: PATH, a temporary HOME, TMPDIR and cache, a process token."""
    base = tempfile.mkdtemp(prefix=tree_prefix("qa-home"))
    try:
        env = {
            "PATH": os.environ.get("PATH", os.defpath),
            "HOME": os.path.join(base, "home"),
            "TMPDIR": os.path.join(base, "tmp"),
            "XDG_CACHE_HOME": os.path.join(base, "cache"),
            "IMM_VERIFICATION_PROCESS_TOKEN": secrets.token_hex(16),
        }
        for key in ("HOME", "TMPDIR", "XDG_CACHE_HOME"):
            os.mkdir(env[key], 0o700)
        yield env
    finally:
        shutil.rmtree(base, ignore_errors=True)


class Output(Captured):
    """What a command wrote: the sha256 and length of its output, stdout and stderr as the one stream
    the runner reads (stderr is joined to stdout), up to where the run stopped (exit, timeout, limit),
    and its last `OUTPUT_TAIL_LIMIT` bytes; `started` once the command ran, then when (`started_at`, the
    wall clock), how long (`duration_ms`), and why it failed, in one line (`reason`, its tail left out)."""

    def __init__(self) -> None:
        super().__init__(keep=0)
        self.started = False
        self.tail = b""
        self.started_at: str | None = None
        self.duration_ms: int | None = None
        self.reason: str | None = None
        self._began = 0.0

    def add(self, chunk: bytes) -> None:
        super().add(chunk)
        self.tail = (self.tail + chunk)[-OUTPUT_TAIL_LIMIT:]

    def begin(self) -> None:
        self.started = True
        self.started_at = format_timestamp(check_clock())
        self._began = check_timer()

    def end(self, reason: str | None) -> None:
        self.duration_ms = int(round((check_timer() - self._began) * 1000))
        self.reason = reason

    def tail_text(self, limit: int) -> str:
        """The output's last `limit` bytes or less, from a line start when one is within them (UTF-8, a cut
        character replaced), trailing blank space dropped."""
        kept = self.tail[-limit:]
        if len(kept) < self.size:
            newline = kept.find(b"\n")
            if 0 <= newline < len(kept) - 1:
                kept = kept[newline + 1:]
        return kept.decode("utf-8", "replace").rstrip()


def check_clock() -> Any:
    """When a check starts, as a UTC datetime (the fixture recorder replaces it and `check_timer`: its logs
    repeat byte for byte)."""
    from datetime import datetime, timezone

    return datetime.now(timezone.utc)


def check_timer() -> float:
    """Seconds on a monotonic clock, for how long a check ran."""
    return time.monotonic()


def run_command(tree: str, command: CommandSpec, env: dict[str, str], output: Output | None = None,
                cancel: Cancel | None = None) -> str | None:
    """Run one descriptor command in `tree`; None when it passed, else the reason it failed.
    `output`, when given, receives the digest of what the command wrote (`started` once it ran).
    With `cancel` set (now or while it runs), the command is killed and the reason is CANCELLED."""
    cwd = _inside(tree, command.cwd)
    if cwd is None or not os.path.isdir(cwd):
        return f"cwd {command.cwd} is not a directory inside the tree"
    try:
        executable = resolve_executable(tree, command.executable, env["PATH"])
    except CheckError as error:
        return str(error)
    if cancel is not None and cancel.is_set():
        return CANCELLED
    output = output if output is not None else Output()
    output.begin()
    try:
        process = start_check([executable, *command.argv], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    except OSError as error:
        output.started = False
        return f"{command.executable} could not start: {error.strerror or error}"
    hook = cancel.on_set(lambda: _kill_quietly(process)) if cancel is not None else None
    try:
        reason = _supervise(process, command, output)
    finally:
        if cancel is not None:
            cancel.forget(hook)
    if cancel is not None and cancel.is_set() and reason is not None:
        reason, output.reason = CANCELLED, None  # killed because it was cancelled, whatever its exit says
    # The reason without the output it quotes: the log keeps the tail on its own.
    output.end(None if reason is None else output.reason or reason)
    return reason


def resolve_executable(tree: str, executable: str, path: str) -> str:
    """The absolute executable; CheckError with the reason when it cannot be run.

    `./<file>` resolves inside the tree (after symlinks) to a regular, executable file; a
    tool name resolves on PATH.
    """
    if executable.startswith("./"):
        resolved = _inside(tree, executable[2:])
        if resolved is None:
            raise CheckError(f"executable {executable} resolves outside the tree")
        if not os.path.isfile(resolved):
            raise CheckError(f"executable {executable} does not exist in the tree")
        if not os.access(resolved, os.X_OK):
            raise CheckError(f"executable {executable} is not executable")
        return resolved
    found = shutil.which(executable, path=path)
    if found is None:
        raise CheckError(f"executable {executable} was not found on PATH")
    return found


def _inside(tree: str, relative: str) -> str | None:
    """realpath(tree/relative) when it stays inside `tree` (itself a realpath), else None."""
    if os.path.isabs(relative):
        return None
    resolved = os.path.realpath(os.path.join(tree, relative))
    if resolved != tree and not resolved.startswith(tree + os.sep):
        return None
    return resolved


def _supervise(process: subprocess.Popen[bytes], command: CommandSpec, output: Output) -> str | None:
    """Read the combined output until EOF; kill the process group on timeout or too much output."""
    deadline = time.monotonic() + command.timeout_ms / 1000
    total = 0
    tail = b""
    assert process.stdout is not None
    descriptor = process.stdout.fileno()
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(descriptor, selectors.EVENT_READ)
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return f"timed out after {command.timeout_ms} ms"
                if not selector.select(min(remaining, IDLE_POLL_SECONDS)):
                    if process.poll() is not None:
                        break  # exited, but a stray child of its group still holds the output open
                    continue
                chunk = os.read(descriptor, READ_CHUNK)
                if not chunk:
                    break
                total += len(chunk)
                output.add(chunk)
                tail = (tail + chunk)[-OUTPUT_TAIL_BYTES:]
                if total > command.max_output_bytes:
                    return f"output exceeded {command.max_output_bytes} bytes"
        try:
            code = process.wait(timeout=max(deadline - time.monotonic(), 0.001))
        except subprocess.TimeoutExpired:
            return f"timed out after {command.timeout_ms} ms"
    finally:
        kill_group(process)
        process.stdout.close()
    output.reason = _exit_reason(command.executable, code, b"")
    return _exit_reason(command.executable, code, tail)




def _exit_reason(executable: str, code: int, tail: bytes) -> str | None:
    if code == 0:
        return None
    what = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
    shown = " ".join(tail.decode("utf-8", "replace").split())
    return f"{executable} {what}" + (f": {shown}" if shown else "")


def _copy_entry(source: str, destination: str) -> tuple[str, str] | None:
    """Copy one listed path: symlinks as links, regular files with git's mode (0644 or 0755); anything else
    is skipped. Returns the copy's (git mode, object id), None when nothing was copied."""
    if not os.path.lexists(source):
        return None  # a tracked file the worktree deleted
    os.makedirs(os.path.dirname(destination), exist_ok=True)
    if os.path.islink(source):
        target = os.readlink(source)
        os.symlink(target, destination)
        return SYMLINK, blob_id(os.fsencode(target))
    if not os.path.isfile(source):
        return None
    with open(source, "rb") as handle:
        content = handle.read()
    executable = bool(os.stat(source).st_mode & 0o100)
    mode = 0o755 if executable else 0o644
    handle_out = os.open(destination, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        view = memoryview(content)
        while view:
            view = view[os.write(handle_out, view):]
        os.fchmod(handle_out, mode)  # the mode as git would check it out, whatever the umask
    finally:
        os.close(handle_out)
    return (EXECUTABLE if executable else REGULAR), blob_id(content)
