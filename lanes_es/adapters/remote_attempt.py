"""An Executor attempt on a Ray node: the Lane's files checked out there, the agent run by the very attempt
process a local attempt runs (lanes_es/executors/attempt.py: its limits, its process group, its usage
reader), and what it changed read back as the delivery. It submits nothing: the coordinator writes the
delivery into the Lane, checked against the task's scope, and submits there.

The checkout is a fresh repository whose one commit is the Lane as the coordinator sent it (agents
expect a git repository); the delivery is what `git status` in it lists afterwards (ignored files, such
as the attempt's temporary directory under .imm/state/, are not delivered). The agent's environment is
the node's own (its credentials live there, never sent) with the Executor contract's variables.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
import tempfile
import threading
from typing import Any

import msgspec

from lanes_es.adapters.git import batch_identity_env, git
from lanes_es.adapters.processes import run_bounded
from lanes_es.adapters.ray_host import AttemptRequest, DeliveredFile
from lanes_es.executors import agent_named
from lanes_es.domain.events import ExecutorUsage
from lanes_es.executors.attempt import AttemptResult, AttemptSpec, ask_to_stop, read_progress, write_atomically
from lanes_es.executors.environment import executor_environment

OUTPUT_KEPT = 256 * 1024  # the head of what the attempt printed that goes back for its log file
GRACE_SECONDS = 30  # the attempt process enforces the limit itself; this bounds a stuck one


class AttemptWatch:
    """The coordinator's hold on an attempt running on this node, as the autopilot holds a local one: what its
    agent reported so far (the attempt process's progress file), and a stop (the reason in its stop file,
    then SIGTERM: the attempt process kills its agent and records why). A stop asked before the attempt
    process started reaches it as soon as it starts."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: Any = None
        self._spec: AttemptSpec | None = None
        self._asked: tuple[str, str] | None = None  # (reason, detail) once a stop was asked

    def attach(self, process: Any, spec: AttemptSpec) -> None:
        with self._lock:
            self._process, self._spec = process, spec
            if self._asked is not None:
                self._send()

    def stop(self, reason: str, detail: str) -> None:
        with self._lock:
            self._asked = (reason, detail)
            if self._process is not None:
                self._send()

    def progress(self) -> ExecutorUsage:
        spec = self._spec
        return read_progress(spec.progress_path) if spec is not None else ExecutorUsage()

    def _send(self) -> None:
        assert self._spec is not None and self._asked is not None
        ask_to_stop(self._spec.stop_path, self._process.pid, *self._asked)


def run_attempt_here(tree: Any, request: AttemptRequest,
                     watch: AttemptWatch | None = None) -> tuple[AttemptResult, list[DeliveredFile], bytes]:
    """Run the attempt in a checkout of `tree`; its result, its delivery, and the head of its output. `watch`:
    the coordinator's hold on it while it runs (its progress, its stop)."""
    watch = watch or AttemptWatch()
    agent = agent_named(request.agent)
    if agent is None:
        raise ValueError(f"no Executor adapter named {request.agent!r} on this node")
    base = tempfile.mkdtemp(prefix="lanes-es-attempt-")
    try:
        work = os.path.join(base, "work")
        os.mkdir(work)
        tree.write_to(work)
        _commit_as_sent(work)
        limits = request.limits
        spec = AttemptSpec(agent=agent.name, argv=agent.argv(request.program, work, request.prompt, limits), lane=work,
                           timeout_seconds=limits.timeout_seconds, max_tokens=limits.tokens,
                           max_cost_usd=limits.cost_usd, tmpdir=os.path.join(work, ".imm", "state", "executor-tmp"),
                           result_path=os.path.join(base, "result.json"),
                           progress_path=os.path.join(base, "progress.json"),
                           stop_path=os.path.join(base, "stop.json"), submit_argv=[])
        spec_path = os.path.join(base, "spec.json")
        write_atomically(spec_path, msgspec.json.encode(spec))
        env = executor_environment(os.environ, {**request.contract, "LANES_ES_LANE_PATH": work},
                                   agent.environment(work))
        _, out, _ = run_bounded([sys.executable, "-P", "-m", "lanes_es.executors.attempt", spec_path], cwd=work,
                                stdin=b"", timeout=limits.timeout_seconds + GRACE_SECONDS, keep_stdout=OUTPUT_KEPT,
                                keep_stderr=0, env=env, started=lambda process: watch.attach(process, spec))
        try:
            result = msgspec.json.decode(open(spec.result_path, "rb").read(), type=AttemptResult)
        except (OSError, msgspec.DecodeError):
            result = AttemptResult(exit_code=None, duration_ms=0, killed="lost",
                                   detail="the attempt process left no result on its node")
        return result, delivery_of(work), out.head
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _commit_as_sent(work: str) -> None:
    git(work, "init", "-q")
    git(work, "add", "-A")
    git(work, "commit", "-q", "--allow-empty", "--no-verify", "-m", "the Lane as lanes-es sent it",
        env=batch_identity_env())


def delivery_of(work: str) -> list[DeliveredFile]:
    """Each path the attempt changed, added or removed in `work`, with what it holds now."""
    listed = git(work, "status", "--porcelain=v1", "-z", "--untracked-files=all", "--no-renames")
    tokens = listed.stdout.decode("utf-8", "surrogateescape").split("\0")
    delivered: list[DeliveredFile] = []
    for token in tokens:
        if len(token) < 4:
            continue
        path = token[3:]
        full = os.path.join(work, path)
        try:
            info = os.lstat(full)
        except FileNotFoundError:
            delivered.append(DeliveredFile(path, ""))
            continue
        if stat.S_ISLNK(info.st_mode):
            delivered.append(DeliveredFile(path, "120000", os.fsencode(os.readlink(full))))
        elif stat.S_ISREG(info.st_mode):
            with open(full, "rb") as handle:
                delivered.append(DeliveredFile(path, "100755" if info.st_mode & 0o111 else "100644", handle.read()))
    return delivered
