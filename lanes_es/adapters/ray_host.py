"""What runs on a Ray node for lanes-es: the node's host, one detached actor per node.

The coordinator keeps git and the log; a node receives values and returns values:

- a candidate's tree as git objects (its listing and its blobs, `TreePayload`), put once per candidate in
  Ray's object store and handed to the host as a reference inside a list, so that Ray does not resolve
  it per call: the host fetches it once, decodes it once, and every check of that candidate on this node
  writes its own fresh copy from it;
- a task's intent; each check then runs exactly as a local one does (`run_check_here`, the local runner's
  own code: no shell, the limited environment, its own process group, the timeout, the output cap, the
  protected inputs hashed before and after), and its result goes back as msgpack bytes of `HostResult`,
  which the coordinator decodes as that type and nothing else. A node that cannot fetch the tree (its
  object store failing, as when the node goes away) answers `lost`: the coordinator sends the check
  elsewhere and never counts it as the Lane's failure.

The host is a detached actor named after its node, so that a coordinator that restarts (a new Ray
Client session) finds the attempts its predecessor started there: each attempt is kept under its id
with the batch that started it, running or finished, until the coordinator collects or cancels it.
Ray never retries anything here (`max_restarts=0`, `max_task_retries=0`): a lost node is the
coordinator's decision, recorded in its log.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from typing import Any

import msgspec

from lanes_es.domain.events import AttemptLimits, CommandDigest
from lanes_es.executors.attempt import AttemptResult

HOST_PREFIX = "lanes-es-host-"
TREES_KEPT = 8  # decoded candidate trees a host keeps (a round's candidates share most blobs)
RESULTS_KEPT = 4096  # finished attempts kept for a coordinator to collect
RESULT_LIMIT = 4 * 1024 * 1024  # the most bytes a check's answer may hold; more is not a result
DELIVERY_LIMIT = 256 * 1024 * 1024  # the most bytes an Executor attempt's delivery may hold


class TreeFile(msgspec.Struct, frozen=True, array_like=True):
    path: str
    mode: str
    kind: str
    sha: str


class TreePayload(msgspec.Struct, frozen=True, kw_only=True):
    """A tree as git holds it: each entry, and each blob's bytes by its id."""

    identity: str
    entries: list[TreeFile]
    blobs: dict[str, bytes]


class HostResult(msgspec.Struct, frozen=True, kw_only=True):
    """One check attempt's end on a node. `error`: the run could not complete (a check failure, never a
    pass); `state` is `finished`, `running` (asked before its end), `unknown` (no such attempt here) or
    `lost` (the node could not run it: not a result of the check)."""

    attempt_id: str
    state: str = "finished"
    node: str = ""
    task_id: str = ""
    findings: list[str] = []
    reasons: list[str] = []  # a Lane's QA: why each finding failed, in the order of `findings`
    outputs: list[CommandDigest] = []
    cancelled: bool = False
    error: str | None = None
    seconds: float = 0.0


class DeliveredFile(msgspec.Struct, frozen=True, array_like=True):
    """A file an Executor attempt changed: its git mode and bytes (a link: its target), or removed (mode "")."""

    path: str
    mode: str
    content: bytes = b""


class AttemptRequest(msgspec.Struct, frozen=True, kw_only=True):
    """An Executor attempt for a node: the named agent, its program and prompt, its limits, and the
    contract variables it is given (its working directory is the node's checkout, not the Lane)."""

    agent: str
    program: str
    prompt: str
    limits: AttemptLimits
    contract: dict[str, str]


class AttemptOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """An Executor attempt's end on a node: the attempt's own result, what it delivered, and the head of
    what it printed (for the attempt's log file; never parsed)."""

    attempt_id: str
    node: str = ""
    state: str = "finished"
    result: AttemptResult | None = None
    delivery: list[DeliveredFile] = []
    output: bytes = b""
    error: str | None = None


def encode_tree(identity: str, entries: dict[str, Any], blobs: dict[str, bytes]) -> bytes:
    """The payload of a tree held as the candidate builder holds it (path -> entry with mode, kind, sha)."""
    files = [TreeFile(path, entry.mode, entry.kind, entry.sha) for path, entry in entries.items()]
    wanted = {entry.sha for entry in entries.values() if entry.kind == "blob"}
    return msgspec.msgpack.encode(TreePayload(identity=identity, entries=files,
                                              blobs={sha: blobs[sha] for sha in wanted}))


def decode_result(raw: Any, kind: type[Any] = None, limit: int = RESULT_LIMIT) -> Any:  # type: ignore[assignment]
    """A host's answer as `kind` (a `HostResult` by default), or ValueError: bytes of a bounded size, of that
    shape and nothing else."""
    if not isinstance(raw, bytes) or len(raw) > limit:
        raise ValueError("a node answered with something that is not a result of lanes-es")
    try:
        return msgspec.msgpack.decode(raw, type=kind or HostResult)
    except (msgspec.ValidationError, msgspec.DecodeError) as error:
        raise ValueError(f"a node answered with a malformed result ({error})") from None


def _tree_from(payload: bytes) -> Any:
    """The candidate builder's tree value, rebuilt from its payload on this node."""
    from lanes_es.adapters.check_runner import CheckTree, TreeEntry

    decoded = msgspec.msgpack.decode(payload, type=TreePayload)
    entries = {item.path: TreeEntry(item.mode, item.kind, item.sha) for item in decoded.entries}
    return CheckTree(entries, decoded.blobs)


def run_check_here(tree: Any, task_id: str, intent: dict[str, Any],
                   cancel: Any = None) -> tuple[list[str], list[CommandDigest]]:
    """The local runner's check, on this node: failed finding ids and each item's output digest."""
    from lanes_es.adapters.check_runner import LocalCheckRunner

    run = LocalCheckRunner().run_check(tree, task_id, intent, cancel)
    return list(run.findings), list(run.outputs)


def run_qa_here(tree: Any, task_id: str, intent: dict[str, Any],
                cancel: Any = None) -> tuple[list[str], list[str], list[CommandDigest]]:
    """A Lane's QA on this node, on a fresh copy of the Lane's files: its findings' ids and reasons, and each
    item's output digest (what the kernel's QA gives locally: adapters/qa.py)."""
    import tempfile

    from lanes_es.adapters.processes import tree_prefix
    from lanes_es.adapters.qa import run_acceptance_with_outputs

    with tempfile.TemporaryDirectory(prefix=tree_prefix("qa-tree"), ignore_cleanup_errors=True) as directory:
        tree.write_to(directory)
        verdict, outputs = run_acceptance_with_outputs(directory, task_id, intent, tree.input_digests(), cancel)
    return [f.id for f in verdict.findings], [f.reason for f in verdict.findings], list(outputs)


class _Attempt:
    def __init__(self, batch_id: str, watch: Any = None) -> None:
        from lanes_es.ports import Cancel

        self.batch_id = batch_id
        self.result: bytes | None = None
        self.done = threading.Event()
        self.cancel = Cancel()  # set by `cancel`: the check's process group is killed, as locally
        self.watch = watch  # an Executor attempt's (remote_attempt.AttemptWatch): its progress and its stop


class NodeHost:
    """The node's host (wrapped by `ray.remote` in `host_actor`): runs checks and Executor attempts in its
    threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._trees: OrderedDict[str, Any] = OrderedDict()
        self._tree_locks: dict[str, threading.Lock] = {}
        self._attempts: OrderedDict[str, _Attempt] = OrderedDict()
        self._node_id: str | None = None

    def describe(self) -> dict[str, str]:
        """Which node this is, and which lanes-es runs here (the coordinator refuses another version)."""
        return {"node": self._node(), "version": lanes_es_version(), "pid": str(os.getpid())}

    def _node(self) -> str:
        """This node's id, asked of Ray once (each check's answer names it)."""
        if self._node_id is None:
            from lanes_es.adapters.ray_cluster import ray_module

            self._node_id = ray_module().get_runtime_context().get_node_id()
        return self._node_id

    def run_check(self, attempt_id: str, batch_id: str, tree_ref: list[Any], task_id: str,
                  intent: dict[str, Any], qa: bool = False) -> bytes:
        """Run one check attempt (`qa`: a Lane's QA) to its end; its result, also kept for `collect` under
        its id."""
        attempt = _Attempt(batch_id)
        with self._lock:
            self._attempts[attempt_id] = attempt
            while len(self._attempts) > RESULTS_KEPT:
                self._attempts.popitem(last=False)
        started = time.monotonic()
        node = self._node()
        try:
            tree = self._tree(tree_ref)
        except Exception as error:  # this node's object store failed it (a node going away): lost, not failed
            return self._end(attempt, HostResult(attempt_id=attempt_id, state="lost", node=node, task_id=task_id,
                                                 error=f"the node could not fetch the tree: {error}"[:500]))
        try:
            reasons: list[str] = []
            if qa:
                findings, reasons, outputs = run_qa_here(tree, task_id, intent, attempt.cancel)
            else:
                findings, outputs = run_check_here(tree, task_id, intent, attempt.cancel)
            result = HostResult(attempt_id=attempt_id, node=node, task_id=task_id, findings=findings,
                                reasons=reasons, outputs=outputs, cancelled=attempt.cancel.is_set(),
                                seconds=time.monotonic() - started)
        except Exception as error:  # the run could not complete: a failure, with why
            result = HostResult(attempt_id=attempt_id, node=node, task_id=task_id, error=str(error),
                                seconds=time.monotonic() - started)
        return self._end(attempt, result)

    @staticmethod
    def _end(attempt: _Attempt, result: Any) -> bytes:
        attempt.result = msgspec.msgpack.encode(result)
        attempt.done.set()
        return attempt.result

    def run_attempt(self, attempt_id: str, batch_id: str, tree_ref: list[Any], request: bytes) -> bytes:
        """Run one Executor attempt in a checkout of the Lane's files (remote_attempt.py); its outcome."""
        from lanes_es.adapters.remote_attempt import AttemptWatch, run_attempt_here

        attempt = _Attempt(batch_id, AttemptWatch())
        with self._lock:
            self._attempts[attempt_id] = attempt
        node = self._node()
        try:
            result, delivery, output = run_attempt_here(self._tree(tree_ref),
                                                        msgspec.msgpack.decode(request, type=AttemptRequest),
                                                        attempt.watch)
            outcome = AttemptOutcome(attempt_id=attempt_id, node=node, result=result, delivery=delivery,
                                     output=output)
        except Exception as error:  # the attempt could not run here: its end, with why
            outcome = AttemptOutcome(attempt_id=attempt_id, node=node, error=f"{type(error).__name__}: {error}")
        return self._end(attempt, outcome)

    def collect(self, attempt_id: str) -> bytes:
        """The attempt's result when it finished, else its state (`running`, or `unknown` here)."""
        with self._lock:
            attempt = self._attempts.get(attempt_id)
        if attempt is None:
            return msgspec.msgpack.encode(HostResult(attempt_id=attempt_id, state="unknown"))
        if attempt.result is None:
            return msgspec.msgpack.encode(HostResult(attempt_id=attempt_id, state="running"))
        return attempt.result

    def cancel(self, attempt_id: str) -> bytes:
        """Stop the attempt if it still runs (its commands killed; an Executor attempt's agent stopped, as the
        autopilot stops one); its state as `collect` gives it."""
        return self.stop_attempt(attempt_id, "stopped", "a later coordinator of its batch cancelled the attempt")

    def stop_attempt(self, attempt_id: str, reason: str, detail: str) -> bytes:
        """`cancel`, with the reason an Executor attempt records for its end (a budget spent)."""
        with self._lock:
            attempt = self._attempts.get(attempt_id)
        if attempt is not None and attempt.result is None:
            attempt.cancel.set()
            if attempt.watch is not None:
                attempt.watch.stop(reason, detail)
        return self.collect(attempt_id)

    def progress(self, attempt_id: str) -> bytes:
        """What a running Executor attempt's agent reported so far (`ExecutorUsage` as msgpack; empty when none)."""
        from lanes_es.domain.events import ExecutorUsage

        with self._lock:
            attempt = self._attempts.get(attempt_id)
        usage = attempt.watch.progress() if attempt is not None and attempt.watch is not None else ExecutorUsage()
        return msgspec.msgpack.encode(usage)

    def attempts_of(self, batch_id: str) -> list[str]:
        """The ids of the attempts of `batch_id` this host holds (running or finished)."""
        with self._lock:
            return [attempt_id for attempt_id, attempt in self._attempts.items() if attempt.batch_id == batch_id]

    def _tree(self, tree_ref: list[Any]) -> Any:
        """The candidate's tree, decoded once on this node for all its checks here."""
        from lanes_es.adapters.ray_cluster import ray_module

        key = tree_ref[0].hex()
        with self._lock:
            lock = self._tree_locks.setdefault(key, threading.Lock())
        with lock:  # the first check of a candidate fetches it; the others wait for it, not fetch it again
            with self._lock:
                if key in self._trees:
                    self._trees.move_to_end(key)
                    return self._trees[key]
            tree = _tree_from(ray_module().get(tree_ref[0]))
            with self._lock:
                self._trees[key] = tree
                while len(self._trees) > TREES_KEPT:
                    dropped, _ = self._trees.popitem(last=False)
                    self._tree_locks.pop(dropped, None)
            return tree


def lanes_es_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lanes-es")
    except PackageNotFoundError:
        return "unknown"


def host_actor(ray: Any, node_id: str, slots: int) -> Any:
    """The host of `node_id`, made there when it is not running yet (detached: it outlives a coordinator)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from lanes_es.adapters.ray_cluster import NAMESPACE

    return ray.remote(NodeHost).options(
        name=f"{HOST_PREFIX}{node_id}", namespace=NAMESPACE, lifetime="detached", get_if_exists=True,
        num_cpus=0, max_restarts=0, max_task_retries=0, max_concurrency=max(slots, 1) + 4,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)).remote()
