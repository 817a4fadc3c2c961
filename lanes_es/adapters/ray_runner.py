"""`RayCheckRunner`: candidate checks on a Ray cluster's nodes, dispatched and accounted for by the coordinator.

Each check is an *attempt* with an id of its own, sent to one node's host (`ray_host.NodeHost`) that the
runner chooses (the alive node with the most free slots; a node's slots are its `lanes_es_slots`
resource), so that the dispatch names its node before anything runs. The candidate's tree goes into Ray's
object store once per candidate; each attempt carries a reference to it.

What can happen to an attempt, and what the runner does (Ray retries nothing: every rerun is decided here):
- it ends: its result (decoded as `HostResult` only) is the check's result;
- its node or host is lost (`RayActorError` and kin, the node reported dead, or the host answering
  `lost` because its object store failed it): the node is taken out, the loss noted, and the check
  sent to another node, up to `LOST_RERUNS` times; a check lost every time raises `ClusterLost`, never
  a failure of the Lane's checks.
Each of these is handed to `journal` (dispatched, ended, lost) for the coordinator's log.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import msgspec

from lanes_es.adapters.ray_cluster import RayUnavailable, connect, slot_nodes
from lanes_es.domain.events import ExecutorUsage

from lanes_es.adapters.ray_host import (
    DELIVERY_LIMIT, AttemptOutcome, AttemptRequest, HostResult, TreePayload, decode_result, encode_tree, host_actor,
    lanes_es_version,
)

LOST_RERUNS = 2  # a check whose node was lost runs again on another node at most this often
# Each check attempt's (seconds from dispatch to its result here, seconds it ran on its node), for `lanes-es
# bench integration --runner`: the difference is what dispatching costs a check. Bounded; this process only.
DISPATCH_TIMES: "deque[tuple[float, float]]" = deque(maxlen=100_000)
TREES_HELD = 16  # candidates' trees the runner keeps in the object store at once


class ClusterLost(RayUnavailable):
    """No node could run a check to its end: the cluster lost them, or has none with slots."""


@dataclass(frozen=True)
class AttemptNote:
    """One fact about an attempt, for the coordinator's log: `dispatched`, `ended` or `lost`."""

    kind: str
    attempt_id: str
    node: str
    task_id: str
    tree: str
    detail: str = ""
    work: str = "check"  # what was sent: a candidate's `check`, a Lane's `qa`, an `executor` attempt


@dataclass
class _Slots:
    """Free check slots per alive node; `take` blocks until one is free and picks the freest node."""

    free: dict[str, int]
    ready: threading.Condition = field(default_factory=threading.Condition)

    def take(self) -> str:
        with self.ready:
            while True:
                if not self.free:
                    raise ClusterLost("the Ray cluster has no node left that offers check slots (lanes_es_slots)")
                node = max(self.free, key=lambda name: self.free[name])
                if self.free[node] > 0:
                    self.free[node] -= 1
                    return node
                self.ready.wait()

    def give_back(self, node: str) -> None:
        with self.ready:
            if node in self.free:
                self.free[node] += 1
            self.ready.notify_all()

    def lose(self, node: str) -> None:
        with self.ready:
            self.free.pop(node, None)
            self.ready.notify_all()


def tree_identity(tree: Any) -> str:
    """The tree's identity: the builder's when it has one, else the digest of its listing."""
    identity = getattr(tree, "identity", None)
    if isinstance(identity, str):
        return identity
    import hashlib

    digest = hashlib.sha256()
    for path, entry in sorted(tree.entries.items()):
        digest.update(f"{entry.mode} {entry.sha} {path}\0".encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


class RayCheckRunner:
    """Checks on the cluster `runner` (`ray://HOST:PORT`) for batch `batch_id`."""

    def __init__(self, runner: str, batch_id: str, journal: Callable[[AttemptNote], None] | None = None) -> None:
        self.runner, self.batch_id = runner, batch_id
        self.journal = journal or (lambda note: None)
        self._ray = connect(runner)
        nodes = slot_nodes(self._ray)
        if not nodes:
            raise ClusterLost(f"the Ray cluster at {runner} has no node that offers check slots: start its nodes "
                              f"with --resources='{{\"lanes_es_slots\": N}}'")
        self._hosts = {node: host_actor(self._ray, node, slots) for node, slots in nodes.items()}
        self._require_same_version()
        # Only the nodes whose host answered: a node switched off is listed alive until Ray notices it is gone
        self.slots = _Slots(free={node: slots for node, slots in nodes.items() if node in self._hosts})
        self._trees: dict[str, Any] = {}
        self._putting: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()

    def _require_same_version(self) -> None:
        here = lanes_es_version()
        asked = {node: host.describe.remote() for node, host in self._hosts.items()}  # all nodes at once
        for node, answer in asked.items():
            try:
                there = self._ray.get(answer, timeout=120)["version"]
            except self._lost_errors():
                self._hosts.pop(node)
                continue
            if there != here:
                raise RayUnavailable(f"node {node} of the Ray cluster runs lanes-es {there}, this coordinator "
                                     f"{here}: install the same version on every node")

    def _lost_errors(self) -> tuple[type[BaseException], ...]:
        exceptions = self._ray.exceptions
        return tuple(getattr(exceptions, name) for name in (
            "RayActorError", "ActorUnavailableError", "NodeDiedError", "WorkerCrashedError", "ObjectLostError",
            "OwnerDiedError", "GetTimeoutError") if hasattr(exceptions, name))

    def tree_ref(self, tree: Any) -> tuple[str, Any]:
        """The tree's identity and its one reference in the object store (put at its first check)."""
        identity = tree_identity(tree)
        with self._lock:
            ref = self._trees.get(identity)
            putting = self._putting.setdefault(identity, threading.Lock()) if ref is None else None
        if putting is None:
            return identity, ref
        # One put per tree, the trees of a round's candidates put at once (not one after another under one lock)
        with putting:
            with self._lock:
                ref = self._trees.get(identity)
            if ref is None:
                ref = self._ray.put(encode_tree(identity, tree.entries, tree.blobs))
                with self._lock:
                    self._trees[identity] = ref
                    self._putting.pop(identity, None)
                    while len(self._trees) > TREES_HELD:
                        self._trees.pop(next(iter(self._trees)))
            return identity, ref

    def run_attempts(self, tree: Any, task_id: str, intent: dict[str, Any], cancel: Any = None,
                     work: str = "check") -> HostResult:
        """One task's check on the cluster: dispatched, and dispatched again on another node when its node is
        lost, at most LOST_RERUNS times; ClusterLost past that. `cancel` (a `Cancel`) set: the node kills
        the check's commands and the result is `cancelled`."""
        began = time.monotonic()
        identity, ref = self.tree_ref(tree)
        for _ in range(LOST_RERUNS + 1):
            sent = self._dispatch(task_id, identity, lambda host, attempt_id: host.run_check.remote(
                attempt_id, self.batch_id, [ref], task_id, intent, work == "qa"), cancel, work)
            if sent is None:
                continue
            attempt_id, node, raw = sent
            try:
                result = decode_result(raw)
            except ValueError as error:
                result = HostResult(attempt_id=attempt_id, node=node, task_id=task_id, error=str(error))
            if result.attempt_id != attempt_id or result.task_id != task_id:
                result = HostResult(attempt_id=attempt_id, node=node, task_id=task_id,
                                    error="a node answered for another attempt")
            if result.state == "lost":  # the node could not run it: sent elsewhere, the node taken out
                self._lose(node, AttemptNote("lost", attempt_id, node, task_id, identity, result.error or "", work))
                continue
            self.journal(AttemptNote("ended", attempt_id, node, task_id, identity, _outcome(result), work))
            DISPATCH_TIMES.append((time.monotonic() - began, result.seconds))
            return result
        raise ClusterLost(f"the check of {task_id} was lost with its node {LOST_RERUNS + 1} times on {self.runner}; "
                          f"run the tick again when the cluster is whole")

    def run_executor_attempt(self, task_id: str, lane: TreePayload, request: AttemptRequest) -> AttemptOutcome:
        """One Executor attempt on a node, in a checkout of the Lane's files; a lost node is its end (`lost`):
        the autopilot's retry policy decides what follows, as for a local attempt that was lost."""
        ref = self._ray.put(msgspec.msgpack.encode(lane))
        payload = msgspec.msgpack.encode(request)
        sent = self._dispatch(task_id, lane.identity, lambda host, attempt_id: host.run_attempt.remote(
            attempt_id, self.batch_id, [ref], payload), work="executor")
        if sent is None:
            return AttemptOutcome(attempt_id="", state="lost", error="its node was lost")
        attempt_id, node, raw = sent
        try:
            outcome = decode_result(raw, AttemptOutcome, DELIVERY_LIMIT)
        except ValueError as error:
            outcome = AttemptOutcome(attempt_id=attempt_id, node=node, error=str(error))
        if outcome.attempt_id != attempt_id:
            outcome = AttemptOutcome(attempt_id=attempt_id, node=node, error="a node answered for another attempt")
        self.journal(AttemptNote("ended", attempt_id, node, task_id, lane.identity,
                                 outcome.error or (outcome.result.killed if outcome.result else None) or "finished",
                                 "executor"))
        return outcome

    def _dispatch(self, task_id: str, identity: str, call: Callable[[Any, str], Any], cancel: Any = None,
                  work: str = "check") -> tuple[str, str, Any] | None:
        """Send one attempt to the freest node and wait for its answer: (attempt id, node, answer), or None when
        the node was lost on the way (taken out, the loss noted)."""
        node = self.slots.take()
        attempt_id = uuid.uuid4().hex
        hook = None
        try:
            self.journal(AttemptNote("dispatched", attempt_id, node, task_id, identity, work=work))
            host = self._hosts.get(node)
            try:
                if host is None:
                    raise ClusterLost(f"node {node} has no host")
                answer = call(host, attempt_id)
                if cancel is not None:  # a cancelled candidate: the node kills the check's commands
                    hook = cancel.on_set(lambda: host.cancel.remote(attempt_id))
                return attempt_id, node, self._ray.get(answer)
            except (ClusterLost, *self._lost_errors()) as error:
                self._lose(node, AttemptNote("lost", attempt_id, node, task_id, identity, _first_line(error), work))
                return None
        finally:
            if cancel is not None:
                cancel.forget(hook)
            self.slots.give_back(node)

    def _lose(self, node: str, note: AttemptNote) -> None:
        """A node that lost an attempt is taken out of this runner's slots, and the loss noted."""
        self.slots.lose(node)
        self.journal(note)

    def stop_attempt(self, node: str, attempt_id: str, reason: str, detail: str) -> None:
        """Ask an Executor attempt running on `node` to end, with why (its agent is stopped as a local one is, and
        its end records the reason); nothing when its node is gone (its loss is its end)."""
        host = self._hosts.get(node)
        if host is None:
            return
        try:
            self._ray.get(host.stop_attempt.remote(attempt_id, reason, detail), timeout=60)
        except Exception:  # noqa: BLE001 - the node or the connection is gone: the attempt ends at its own limits
            pass

    def progress(self, node: str, attempt_id: str) -> ExecutorUsage:
        """What an Executor attempt's agent on `node` reported so far; nothing when its node does not answer."""
        host = self._hosts.get(node)
        if host is None:
            return ExecutorUsage()
        try:
            return decode_result(self._ray.get(host.progress.remote(attempt_id), timeout=10), ExecutorUsage)
        except Exception:  # noqa: BLE001 - a node or connection gone, or a malformed answer: nothing reported
            return ExecutorUsage()

    def collect(self, node: str, attempt_id: str, cancel: bool = False) -> HostResult:
        """An attempt a coordinator before this one started: its result, or its state (running, unknown);
        `cancel`: stopped first when it still runs."""
        host = self._hosts.get(node)
        if host is None:
            return HostResult(attempt_id=attempt_id, state="unknown", node=node)
        try:
            call = host.cancel if cancel else host.collect
            raw = self._ray.get(call.remote(attempt_id), timeout=60)
            return decode_result(raw, HostResult, DELIVERY_LIMIT)
        except (ValueError, *self._lost_errors()):
            return HostResult(attempt_id=attempt_id, state="unknown", node=node)


def _outcome(result: HostResult) -> str:
    if result.error is not None:
        return "could not run"
    if result.cancelled:
        return "cancelled"
    return "failed" if result.findings else "passed"


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:300] if text else ''}"


def settle(cluster: RayCheckRunner, attempts: dict[str, Any]) -> list[AttemptNote]:
    """Attempts an earlier coordinator of this batch sent (the log's open ones, by id, each its
    `RemoteAttemptDispatched`): each collected when it finished, cancelled when it still runs (an Executor
    attempt's agent stopped), lost when its node no longer knows it; a note of each for the log. Their
    results are not used: what they were sent to do is the new coordinator's to do again."""
    notes = []
    for attempt_id, sent in attempts.items():
        found = cluster.collect(sent.node, attempt_id, cancel=True)
        if found.state == "unknown":
            notes.append(AttemptNote("lost", attempt_id, sent.node, sent.task_id, sent.tree,
                                     "its node no longer knows it (the node or its host was lost)", sent.kind))
        else:
            outcome = "cancelled" if found.state == "running" else "collected"
            notes.append(AttemptNote("ended", attempt_id, sent.node, sent.task_id, sent.tree,
                                     f"{outcome} by a later coordinator", sent.kind))
    return notes
