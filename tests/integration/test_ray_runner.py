"""Candidate checks on a local three-node Ray cluster (tests/integration/ray_cluster.py), started once for
the module: each check's result on a node is the local runner's result on the same tree, the tree goes
into the object store once per candidate, and a node removed while its checks run loses them to the
other nodes, with every dispatch and loss noted. No store: the runner alone (the batch-level tests
run lanes-es on the cluster)."""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator

import pytest

from lanes_es.adapters.lane_git import CandidateTree
from lanes_es.adapters.ray_host import run_check_here
from tests.gitfixtures import commit_file, descriptor, make_repo, write_file
from tests.integration.ray_cluster import LocalRayCluster, local_ray_cluster


@pytest.fixture(scope="module")
def agent_scenario(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fake agents' scenario file, in the nodes' environment (a test writes what the agents do)."""
    return tmp_path_factory.mktemp("agents") / "scenario.json"


@pytest.fixture(scope="module")
def cluster(agent_scenario: Path) -> Iterator[LocalRayCluster]:
    """The cluster, and its token in this process's environment (Ray reads it when it is first imported:
    nothing here imports Ray before)."""
    with local_ray_cluster(node_env={"FAKE_AGENT_SCENARIO": str(agent_scenario)}) as started:
        saved = {key: os.environ.get(key) for key in started.env()}
        os.environ.update(started.env())
        try:
            yield started
        finally:
            from lanes_es.adapters.ray_cluster import disconnect

            disconnect()
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> CandidateTree:
    root = make_repo(tmp_path_factory.mktemp("repo") / "repo")
    commit_file(root, "src/input.txt", "held\n")
    return CandidateTree.read(root, "HEAD")


def intent(*commands: list[str], writable: list[str] | None = None, timeout_ms: int = 20000) -> dict[str, Any]:
    items = []
    for index, argv in enumerate(commands):
        verification = descriptor(argv, timeout_ms=timeout_ms)
        if writable:
            verification = verification.replace('"writable_paths": []', f'"writable_paths": {writable!r}'
                                                .replace("'", '"'))
        items.append({"id": f"A{index}", "assertion": "holds", "verification": verification})
    return {"acceptance": items}


FAKES = Path(__file__).resolve().parents[1] / "fakes" / "agents"

CASES = {
    "passes": intent(["-c", "print('fine')"]),
    "fails": intent(["-c", "import sys; print('broken'); sys.exit(3)"]),
    "reads its tree": intent(["-c", "import sys; sys.exit(open('src/input.txt').read() != 'held\\n')"]),
    "alters an input": intent(["-c", "open('src/input.txt', 'w').write('changed')"]),
    "writes where it may": intent(["-c", "import os; os.makedirs('out'); open('out/x', 'w').write('x')"],
                                  writable=["out"]),
    "outlives its timeout": intent(["-c", "import time; time.sleep(30)"], timeout_ms=500),
    "missing executable": {"acceptance": [{"id": "A0", "assertion": "holds",
                                           "verification": descriptor([], executable="no-such-tool-here")}]},
}


def test_a_check_on_a_node_is_the_local_check(cluster: LocalRayCluster, tree: CandidateTree) -> None:
    from lanes_es.adapters.ray_runner import RayCheckRunner

    notes: list[Any] = []
    runner = RayCheckRunner(cluster.runner, "batch-ray-test", notes.append)
    # Each case three times at once, so that every node runs some: 21 checks on 36 slots.
    jobs = [(name, copy) for name in CASES for copy in range(3)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        remote = list(pool.map(lambda job: runner.run_attempts(tree, f"task-{job[1]}", CASES[job[0]]), jobs))
    for (name, copy), result in zip(jobs, remote):
        findings, outputs = run_check_here(tree, f"task-{copy}", CASES[name])
        assert (name, result.findings, result.error) == (name, findings, None)
        assert [(o.id, o.passed, o.output_sha256, o.output_bytes) for o in result.outputs] == \
               [(o.id, o.passed, o.output_sha256, o.output_bytes) for o in outputs], name
        assert result.node in cluster.nodes.values()
    assert {result.node for result in remote} == set(cluster.nodes.values())
    assert [note.kind for note in notes].count("dispatched") == len(jobs)
    dispatched = {note.attempt_id: note.node for note in notes if note.kind == "dispatched"}
    assert {note.attempt_id: note.node for note in notes if note.kind == "ended"} == dispatched
    assert {result.attempt_id for result in remote} == set(dispatched)


def test_a_candidates_tree_goes_to_the_object_store_once(cluster: LocalRayCluster, tree: CandidateTree) -> None:
    from lanes_es.adapters.ray_runner import RayCheckRunner

    runner = RayCheckRunner(cluster.runner, "batch-ray-test")
    first, again = runner.tree_ref(tree), runner.tree_ref(CandidateTree(tree.entries, tree.blobs))
    assert first[0] == again[0] and first[1] is again[1]


def test_an_executor_attempt_runs_on_a_node_and_its_delivery_comes_back_checked_against_the_scope(
        cluster: LocalRayCluster, agent_scenario: Path, tmp_path: Path) -> None:
    from lanes_es.adapters.ray_host import AttemptRequest, DeliveredFile
    from lanes_es.adapters.ray_runner import RayCheckRunner
    from lanes_es.adapters.remote_lane import DeliveryRefused, lane_payload, write_delivery
    from lanes_es.domain.events import AttemptLimits

    lane = make_repo(tmp_path / "lane")
    write_file(lane, "task-a.txt", "work so far\n")  # the Lane's work of an earlier attempt travels too
    agent_scenario.write_text(json.dumps({"record": str(tmp_path / "record"), "tasks": {
        "task-a": [{"append": {"task-a.txt": "delivered\n"}, "tokens_in": 10, "tokens_out": 5}],
        "task-b": [{"write": {"task-a.txt": "not mine\n", "src/other.txt": "outside\n"}}]}}))
    notes: list[Any] = []
    runner = RayCheckRunner(cluster.runner, "batch-ray-test", notes.append)

    def attempt(task_id: str) -> Any:
        request = AttemptRequest(agent="claude-code", program=str(FAKES / "claude"), prompt=f"Deliver {task_id}",
                                 limits=AttemptLimits(timeout_seconds=60),
                                 contract={"LANES_ES_TASK_ID": task_id, "LANES_ES_NEXT_OBLIGATION": "submit_assurance"})
        return runner.run_executor_attempt(task_id, lane_payload(lane), request)

    done = attempt("task-a")
    assert done.error is None and done.result is not None and done.result.exit_code == 0
    assert done.result.submitted is None  # nothing submitted on the node: the coordinator does, in the Lane
    assert (done.result.usage.tokens_in, done.result.usage.tokens_out) == (10, 5)
    assert done.delivery == [DeliveredFile("task-a.txt", "100644", b"work so far\ndelivered\n")]
    assert done.node in cluster.nodes.values()
    call = json.loads((tmp_path / "record" / "task-a.jsonl").read_text().splitlines()[0])
    assert call["cwd"] != lane and not call["cwd"].startswith(lane)  # it ran in the node's checkout
    write_delivery(lane, "task-a", ["task-a.txt"], done.delivery)
    assert (Path(lane) / "task-a.txt").read_text() == "work so far\ndelivered\n"

    breach = attempt("task-b")
    assert {item.path for item in breach.delivery} == {"task-a.txt", "src/other.txt"}
    with pytest.raises(DeliveryRefused, match="outside the scope of task-b: src/other.txt, task-a.txt"):
        write_delivery(lane, "task-b", ["docs/"], breach.delivery)
    assert (Path(lane) / "task-a.txt").read_text() == "work so far\ndelivered\n"  # nothing written
    assert not (Path(lane) / "src" / "other.txt").exists()
    assert [note.kind for note in notes] == ["dispatched", "ended", "dispatched", "ended"]


def test_a_node_removed_mid_check_loses_its_checks_to_the_other_nodes(cluster: LocalRayCluster,
                                                                      tree: CandidateTree) -> None:
    """Last in the module: the cluster keeps two nodes after it."""
    from lanes_es.adapters.ray_runner import RayCheckRunner

    notes: list[Any] = []
    runner = RayCheckRunner(cluster.runner, "batch-ray-test", notes.append)
    slow = intent(["-c", "import time; time.sleep(4)"])
    with ThreadPoolExecutor(36) as pool:
        futures = [pool.submit(runner.run_attempts, tree, f"task-{index}", slow) for index in range(36)]
        while sum(note.kind == "dispatched" for note in notes) < 36:
            pass
        cluster.remove_node("b")
        results = [future.result() for future in futures]
    gone = cluster.nodes["b"]
    lost = [note for note in notes if note.kind == "lost"]
    assert lost and all(note.node == gone for note in lost)
    assert all(result.findings == [] and result.error is None and result.node != gone for result in results)
    # Every lost check ran again elsewhere: one more dispatch each, and only the live attempt's result counts.
    assert sum(note.kind == "dispatched" for note in notes) == 36 + len(lost)
    assert {result.attempt_id for result in results}.isdisjoint({note.attempt_id for note in lost})
