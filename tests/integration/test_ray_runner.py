"""Candidate checks on a local three-node Ray cluster (tests/integration/ray_cluster.py), started once for
the module: each check's result on a node is the local runner's result on the same tree, the tree goes
into the object store once per candidate, and a node removed while its checks run loses them to the
other nodes, with every dispatch and loss noted. No store: the runner alone (the batch-level tests
run lanes-es on the cluster)."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator

import pytest

from lanes_es.adapters.lane_git import CandidateTree
from lanes_es.adapters.ray_host import run_check_here
from tests.gitfixtures import commit_file, descriptor, make_repo
from tests.integration.ray_cluster import LocalRayCluster, local_ray_cluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalRayCluster]:
    """The cluster, and its token in this process's environment (Ray reads it when it is first imported:
    nothing here imports Ray before)."""
    with local_ray_cluster() as started:
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
