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
from types import SimpleNamespace
from typing import Any, Iterator

import pytest

from lanes_es.adapters.candidate_git import CandidateTree
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
    # The nodes' own environment: the fake agents on their PATH, as a real agent is installed on a node.
    node_env = {"FAKE_AGENT_SCENARIO": str(agent_scenario), "PATH": f"{FAKES}{os.pathsep}{os.environ['PATH']}"}
    with local_ray_cluster(node_env=node_env) as started:
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


def test_a_node_that_cannot_fetch_the_tree_loses_the_check_and_never_fails_it(
        cluster: LocalRayCluster, tree: CandidateTree, monkeypatch: pytest.MonkeyPatch) -> None:
    """A host whose object store fails it (as a node going away does) answers `lost`: the check is sent to
    another node, the node taken out, each loss noted; past the bound the round is refused (ClusterLost),
    never a failed check."""
    from lanes_es.adapters.ray_runner import LOST_RERUNS, ClusterLost, RayCheckRunner

    notes: list[Any] = []
    runner = RayCheckRunner(cluster.runner, "batch-ray-test", notes.append)
    monkeypatch.setattr(runner, "tree_ref", lambda tree: ("unfetchable", b"not an object ref"))
    with pytest.raises(ClusterLost, match="lost with its node 3 times"):
        runner.run_attempts(tree, "task-0", CASES["passes"])
    lost = [note for note in notes if note.kind == "lost"]
    assert len(lost) == LOST_RERUNS + 1 and len({note.node for note in lost}) == 3, notes
    assert all("could not fetch the tree" in note.detail for note in lost)
    assert [note.kind for note in notes].count("ended") == 0 and runner.slots.free == {}


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


# ---------------------------------------------------------------- batches on the cluster, through the tick


def conflicting_batch(seed: int) -> tuple[dict[str, Any], dict[str, tuple[str, str]]]:
    """A random batch: Lanes whose check fails once an earlier Lane's work is under it, Lanes that write the
    same file (the plan serializes them), slow checks, passing ones; and what each Lane delivers."""
    import random

    from tests.engine import Task
    from tests.gitfixtures import fails_if_exists

    rng = random.Random(seed)
    tasks: dict[str, Task] = {}
    deliveries: dict[str, tuple[str, str]] = {}
    for index in range(rng.randint(4, 5)):
        task_id, roll = f"t{index}", rng.random()
        path = "shared.txt" if rng.random() < 0.3 else f"t{index}.txt"
        earlier = deliveries[f"t{rng.randrange(index)}"][0] if index else path
        if roll < 0.4 and earlier != path:
            verification = fails_if_exists(earlier)  # fails once that Lane's work is under it
        elif roll < 0.55:
            verification = descriptor(["-c", "import time; time.sleep(0.3)"])
        else:
            verification = None
        tasks[task_id] = Task([path], verification=verification)
        deliveries[task_id] = (path, f"{task_id}\n")
    if not any(path == "shared.txt" for path, _ in deliveries.values()):
        tasks["t0"], deliveries["t0"] = Task(["shared.txt"]), ("shared.txt", "t0\n")
    return tasks, deliveries


def batch_outcome(engine: Any) -> dict[str, Any]:
    import re

    from tests.gitfixtures import run_git

    sha = re.compile(r"\b[0-9a-f]{40}\b")
    children = [(c["task_id"], c["state"], sha.sub("<sha>", c["reason"] or "")) for c in engine.batch.record["children"]]
    listed = run_git(engine.root, "ls-tree", "-r", f"imm/{engine.slug}", "--", "shared.txt", "t0.txt", "t1.txt",
                     "t2.txt", "t3.txt", "t4.txt").stdout.decode().split("\n")
    return {"children": children, "files": sorted(line.split()[-1] + " " + line.split()[2] for line in listed if line),
            "commits": len(engine.batch.record["commits"]), "state": engine.batch.batch_state}


def remote_events(engine: Any) -> list[Any]:
    from lanes_es.domain import events as ev

    kinds = (ev.RemoteAttemptDispatched, ev.RemoteAttemptEnded, ev.RemoteAttemptLost)
    return [event for event in engine.deps.store.events(engine.batch.id) if isinstance(event, kinds)]


@pytest.mark.parametrize("store_url, seed", [("sqlite", 7), ("postgresql", 9)], indirect=["store_url"])
def test_a_batch_on_the_cluster_integrates_and_parks_as_the_local_runner_does(
        cluster: LocalRayCluster, tmp_path: Path, store_url: str, seed: int, another_store: Any) -> None:
    """The same random batch (speculative) with the local runner and with the cluster, each in its own repository
    and store: the same Lanes integrate, the same park and why, the batch branch holds the same files; on
    the cluster every candidate check and Lane QA is an attempt in the log, dispatched then ended on a node."""
    from lanes_es.domain import events as ev
    from tests.engine import Engine

    tasks, deliveries = conflicting_batch(seed)
    outcomes = {}
    for runner in ("local", cluster.runner):
        name = "local" if runner == "local" else "ray"
        store = another_store()
        engine = Engine.create(tmp_path / name, tasks, store_url=store)
        engine.authorize(max_parallel=len(tasks), integration="speculative", verify_workers=8, runner=runner)
        engine.run_to_end(deliveries)
        outcomes[name] = (batch_outcome(engine), engine)
        assert rebuild_holds(engine, store)
    assert outcomes["ray"][0] == outcomes["local"][0]
    assert {state for _, state, _ in outcomes["local"][0]["children"]} >= {"needs_human", "integrated"}
    engine = outcomes["ray"][1]
    assert {a.runner for a in engine.deps.store.initiative(engine.slug).authorizations} == {cluster.runner}
    recorded = remote_events(engine)
    dispatched = {e.attempt_id: e for e in recorded if isinstance(e, ev.RemoteAttemptDispatched)}
    ended = {e.attempt_id: e for e in recorded if isinstance(e, ev.RemoteAttemptEnded)}
    assert dispatched and set(ended) == set(dispatched)  # every attempt recorded, each before its end
    assert {e.kind for e in dispatched.values()} == {"qa", "check"}
    assert {e.node for e in dispatched.values()} <= set(cluster.nodes.values())
    versions = {e.attempt_id: e.originator_version for e in recorded}
    assert all(dispatched[key].originator_version < ended[key].originator_version for key in ended) and versions
    assert engine.batch.remote_attempts.open == {}


def rebuild_holds(engine: Any, store: str) -> bool:
    from lanes_es.cli.main import main

    return main(["--root", engine.root, "--store", store, "rebuild", engine.batch.id, "--check"]) == 0


@pytest.mark.parametrize("store_url", ["sqlite", "postgresql"], indirect=True)
def test_lanes_es_run_on_the_cluster_runs_the_agents_there_and_integrates_their_deliveries(
        cluster: LocalRayCluster, agent_scenario: Path, tmp_path: Path, store_url: str) -> None:
    """`lanes-es run --runner ray://... --executor claude-code`, the real command line: each attempt runs on a node
    (in a checkout there, not in the Lane; `claude` is on the nodes' PATH, not the coordinator's), its delivery is
    written into the Lane and submitted; greet's first delivery fails its QA on a node, and the rework's prompt
    quotes the reason the node gave; both integrate."""
    from lanes_es.domain import events as ev
    from tests.gitfixtures import git_out

    repo = greetings_repo(tmp_path)
    agent_scenario.write_text(json.dumps({"record": str(tmp_path / "calls"), "tasks": {
        "greet": [{"write": {"src/greet.py": "Hi\n"}, "tokens_in": 100}, {"write": {"src/greet.py": "Hello\n"}}],
        "farewell": [{"write": {"src/farewell.py": "Goodbye\n"}, "tokens_in": 50}]}}))
    lanes = tmp_path / "lanes"
    done = run_on_cluster(cluster, repo, lanes)
    assert done.returncode == 0, done.stdout + done.stderr
    assert git_out(repo, "show", "imm/greetings:src/greet.py") == "Hello"
    assert git_out(repo, "show", "imm/greetings:src/farewell.py") == "Goodbye"
    made = [json.loads(line) for task in ("greet", "farewell")
            for line in (tmp_path / "calls" / f"{task}.jsonl").read_text().splitlines()]
    assert len(made) == 3 and all(not call["cwd"].startswith(str(lanes)) for call in made)  # on the nodes
    assert "found 'Hi\\n'" in made[1]["prompt"]  # the rework quotes the reason QA gave on its node

    from lanes_es.bootstrap import bootstrap

    deps = bootstrap(repo, read_only=True)
    batch_id = deps.store.initiative("greetings").authorizations[-1].batch_id
    events = deps.store.events(batch_id)
    sent = [event for event in events if isinstance(event, ev.RemoteAttemptDispatched)]
    assert sorted(event.task_id for event in sent if event.kind == "executor") == ["farewell", "greet", "greet"]
    assert {event.kind for event in sent} == {"executor", "qa", "check"}
    finished = [event for event in events if isinstance(event, ev.ExecutorRunFinished)]
    assert [(event.task_id, event.submitted) for event in finished].count(("greet", True)) == 2
    assert deps.store.batch(batch_id).remote_attempts.open == {}
    assert rebuild_holds(SimpleNamespace(root=repo, batch=SimpleNamespace(id=batch_id)), store_url)


def greetings_repo(tmp_path: Path) -> str:
    """A repository with the Initiative `greetings`: greet writes src/greet.py (its check wants "Hello"),
    farewell src/farewell.py ("Goodbye"); each check prints what it found."""
    from tests.engine import Task, initiative_markdown
    from tests.gitfixtures import intent_json

    checks = {"greet": ("src/greet.py", "Hello"), "farewell": ("src/farewell.py", "Goodbye")}
    intents = {task: intent_json(task, [path], verification=descriptor(
        ["-c", f"import sys; text = open({path!r}).read(); print('found ' + repr(text)); "
               f"sys.exit({word!r} not in text)"]), goal=f"Write {path}") for task, (path, word) in checks.items()}
    return make_repo(tmp_path / "repo", intents=intents, files={
        "docs/initiatives/greetings.md": initiative_markdown({task: Task([path]) for task, (path, _) in checks.items()})})


def run_argv(cluster: LocalRayCluster, repo: str, lanes: Path, *more: str) -> list[str]:
    import sys

    return [sys.executable, "-m", "lanes_es.cli.main", "--root", repo, "run", "greetings", "--max-parallel", "2",
            "--lanes-dir", str(lanes), "--executor", "claude-code", "--yes", "--poll", "0.05", "--runner",
            cluster.runner, *more]


def cluster_env(cluster: LocalRayCluster) -> dict[str, str]:
    """The coordinator's environment: the cluster's token; the agents are on the nodes' PATH only."""
    path = os.pathsep.join(entry for entry in os.environ["PATH"].split(os.pathsep) if Path(entry) != FAKES)
    return {**os.environ, **cluster.env(), "PATH": path}


def run_on_cluster(cluster: LocalRayCluster, repo: str, lanes: Path, *more: str) -> Any:
    """`lanes-es run greetings --executor claude-code --runner ray://...`, the real command line, to its end."""
    import subprocess

    return subprocess.run(run_argv(cluster, repo, lanes, *more), capture_output=True, text=True,
                          env=cluster_env(cluster), timeout=300)


def batch_events(repo: str) -> list[Any]:
    from lanes_es.bootstrap import bootstrap

    deps = bootstrap(repo, read_only=True)
    try:
        initiative = deps.store.initiative("greetings")
        return deps.store.events(initiative.authorizations[-1].batch_id) if initiative is not None else []
    finally:
        deps.store.close()


def test_the_initiative_budget_ends_attempts_running_on_nodes(
        cluster: LocalRayCluster, agent_scenario: Path, tmp_path: Path, store_url: str) -> None:
    """Both agents report 600 tokens at once, then work on for a minute on their nodes: together they spend the
    Initiative's 1000, which neither attempt's own limit sees. The autopilot reads what each reported on its
    node and ends both there (each records the budget as why), long before their minute is up."""
    import time

    from lanes_es.adapters.processes import process_alive
    from lanes_es.domain import events as ev

    repo = greetings_repo(tmp_path)
    long = {"tokens_in": 600, "sleep": 60}
    agent_scenario.write_text(json.dumps({"record": str(tmp_path / "calls"), "tasks": {
        "greet": [{"write": {"src/greet.py": "Hello\n"}, **long}],
        "farewell": [{"write": {"src/farewell.py": "Goodbye\n"}, **long}]}}))
    began = time.monotonic()
    done = run_on_cluster(cluster, repo, tmp_path / "lanes", "--initiative-budget-tokens", "1000")
    assert time.monotonic() - began < 50, done.stdout + done.stderr
    assert "ending the attempt of" in done.stdout, done.stdout + done.stderr
    events = batch_events(repo)
    killed = {event.task_id: event for event in events if isinstance(event, ev.ExecutorRunKilled)}
    assert set(killed) == {"greet", "farewell"}, events
    assert all(event.reason == "budget" for event in killed.values()), killed
    ended = [event for event in events if isinstance(event, ev.RemoteAttemptEnded)]
    assert len(ended) == 2 and all(event.outcome == "budget" for event in ended), ended
    for task in ("greet", "farewell"):  # the agents on the nodes are gone too
        call = json.loads((tmp_path / "calls" / f"{task}.jsonl").read_text().splitlines()[0])
        assert not process_alive(call["pid"])


def test_a_run_killed_while_an_attempt_runs_on_a_node_leaves_it_to_the_next_run_to_cancel(
        cluster: LocalRayCluster, agent_scenario: Path, tmp_path: Path, store_url: str) -> None:
    """The attempt's dispatch is in the log as soon as it is sent: the run is killed outright while greet's agent
    works on its node; the log holds the attempt open. The next run cancels it on its node (the agent is gone),
    records that, and runs the task again to the end."""
    import signal
    import subprocess
    import time

    from lanes_es.adapters.processes import process_alive
    from lanes_es.domain import events as ev

    repo = greetings_repo(tmp_path)
    agent_scenario.write_text(json.dumps({"record": str(tmp_path / "calls"), "tasks": {
        "greet": [{"sleep": 120}, {"write": {"src/greet.py": "Hello\n"}}],
        "farewell": [{"write": {"src/farewell.py": "Goodbye\n"}}]}}))
    lanes = tmp_path / "lanes"
    said = tmp_path / "first-run.txt"
    with said.open("wb") as sink:
        first = subprocess.Popen(run_argv(cluster, repo, lanes), env=cluster_env(cluster), stdout=sink,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    calls = tmp_path / "calls" / "greet.jsonl"
    deadline = time.monotonic() + 120
    while not (calls.exists() and any(isinstance(event, ev.RemoteAttemptDispatched) and event.task_id == "greet"
                                      and event.kind == "executor" for event in batch_events(repo))):
        assert time.monotonic() < deadline and first.poll() is None, \
            f"greet's attempt was never sent (the run: exit {first.poll()}): {said.read_text()[-3000:]}"
        time.sleep(0.2)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    agent = json.loads(calls.read_text().splitlines()[0])["pid"]
    assert process_alive(agent)  # the run is gone, its attempt works on on its node
    sent = next(event for event in batch_events(repo) if isinstance(event, ev.RemoteAttemptDispatched)
                and event.task_id == "greet")

    done = run_on_cluster(cluster, repo, lanes)
    assert done.returncode == 0, done.stdout + done.stderr
    events = batch_events(repo)
    ended = {event.attempt_id: event.outcome for event in events if isinstance(event, ev.RemoteAttemptEnded)}
    assert ended[sent.attempt_id] == "cancelled by a later coordinator", ended
    deadline = time.monotonic() + 30
    while process_alive(agent):
        assert time.monotonic() < deadline, "the cancelled attempt's agent still runs on its node"
        time.sleep(0.1)
    greet = [event for event in events if isinstance(event, (ev.ExecutorRunKilled, ev.ExecutorRunFinished))
             and event.task_id == "greet"]
    assert [type(event).__name__ for event in greet] == ["ExecutorRunKilled", "ExecutorRunFinished"], greet
    assert all(not isinstance(event, ev.RemoteAttemptDispatched) or event.attempt_id in ended
               or event.attempt_id in {lost.attempt_id for lost in events if isinstance(lost, ev.RemoteAttemptLost)}
               for event in events)


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)  # the log's side is the fold, on both in unit tests
def test_a_coordinator_killed_mid_check_leaves_its_attempts_to_the_next_tick(
        cluster: LocalRayCluster, tree: CandidateTree, tmp_path: Path, store_url: str) -> None:
    """A coordinator that recorded two dispatches and was killed before their ends: the next tick of the batch
    finds them open in the log and settles them on their nodes before it sends anything: the one that finished
    is collected, the one still running is cancelled there (its command killed: its run comes back cancelled)."""
    import threading

    from lanes_es.adapters.ray_checks import RayChecks
    from lanes_es.domain import events as ev
    from lanes_es.domain.remote_attempts import record_remote_notes
    from tests.engine import Engine, Task

    engine = Engine.create(tmp_path, {"t0": Task(["t0.txt"])})
    batch_id = engine.authorize(max_parallel=1, runner=cluster.runner)
    engine.tick()
    killed = RayChecks(cluster.runner, batch_id)  # the coordinator that will be "killed"
    quick = killed.run_check(tree, "t0", intent(["-c", "print('done')"]))
    slow: dict[str, Any] = {}
    running = threading.Thread(target=lambda: slow.update(run=killed.run_check(
        tree, "t0", intent(["-c", "import time; time.sleep(60)"], timeout_ms=120000))))
    running.start()
    notes = killed.drain()
    while len(notes) < 3:  # the quick one's dispatch and end, then the slow one's dispatch
        running.join(0.05)
        notes += killed.drain()
    batch = engine.deps.store.batch(batch_id)
    record_remote_notes(batch, engine.deps.now(), [note for note in notes if note.kind == "dispatched"])
    engine.deps.store.save(batch)  # what it had recorded when it died: two dispatches, no end
    assert len(engine.deps.store.batch(batch_id).remote_attempts.open) == 2 and quick.findings == []

    engine.tick()  # the next coordinator
    running.join()
    assert slow["run"].cancelled
    ended = {event.attempt_id: event.outcome for event in remote_events(engine) if isinstance(event, ev.RemoteAttemptEnded)}
    first, second = (note.attempt_id for note in notes if note.kind == "dispatched")
    assert ended == {first: "collected by a later coordinator", second: "cancelled by a later coordinator"}
    assert engine.batch.remote_attempts.open == {}


@pytest.mark.parametrize("store_url, node", [("sqlite", "b"), ("postgresql", "c")], indirect=["store_url"])
def test_a_node_removed_in_the_middle_of_a_round_converges_with_the_loss_in_the_log(
        cluster: LocalRayCluster, tmp_path: Path, store_url: str, node: str) -> None:
    """Last in the module (each run takes a node away): four Lanes settle in one tick, their QA and the round's
    ten candidate checks run on the nodes; once candidate checks run, a node is switched off. Its checks are
    lost, recorded so, and run again on the others; every Lane integrates once (no commit twice), no
    attempt stays open, and the projections rebuild from the log."""
    import threading

    from lanes_es.domain import events as ev
    from tests.engine import Engine, Task

    markers = tmp_path / "markers"
    markers.mkdir()
    slow = descriptor(["-c", f"import os, time, uuid; open(os.path.join({str(markers)!r}, uuid.uuid4().hex), 'w')"
                             f".close(); time.sleep(3)"])
    tasks = {f"t{index}": Task([f"t{index}.txt"], verification=slow) for index in range(4)}
    engine = Engine.create(tmp_path, tasks)
    engine.authorize(max_parallel=4, integration="speculative", verify_workers=10, runner=cluster.runner)
    report = engine.tick()
    engine.tick(offers={task: engine.provision(task, report) for task in tasks})
    for task in tasks:
        engine.deliver(task, f"{task}.txt", f"{task}\n")
    ticked: dict[str, Any] = {}
    round_tick = threading.Thread(target=lambda: ticked.update(report=engine.tick()))
    round_tick.start()
    while len(list(markers.iterdir())) < len(tasks) + 4 and round_tick.is_alive():  # QA's four, then the round's
        round_tick.join(0.05)
    assert round_tick.is_alive(), "the round ended before the node could be switched off"
    cluster.remove_node(node)
    round_tick.join()
    report = engine.run_to_end({task: (f"{task}.txt", f"{task}\n") for task in tasks})
    assert report["batch_state"] == "completed", report
    gone = cluster.nodes[node]
    events = remote_events(engine)
    lost = [event for event in events if isinstance(event, ev.RemoteAttemptLost)]
    assert lost and all(event.node == gone for event in lost)
    sent = {event.attempt_id: event for event in events if isinstance(event, ev.RemoteAttemptDispatched)}
    assert all(sent[event.attempt_id].kind == "check" for event in lost)
    assert engine.batch.remote_attempts.open == {}
    assert sorted(c["state"] for c in engine.batch.record["children"]) == ["integrated"] * 4
    subjects = engine.subjects(engine.batch.record["base_head"])
    for task in tasks:  # each Lane's commit on the batch branch once
        assert sum(task in subject for subject in subjects) == 1, subjects
    assert rebuild_holds(engine, store_url)


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_run_on_a_cluster_without_its_token_is_refused_before_anything_is_confirmed(
        tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    """No cluster needed: `lanes-es run --runner ray://...` with no token anywhere says so in one line and
    confirms nothing (the agent need not be on this machine's PATH: it runs on the nodes)."""
    from lanes_es.cli.main import main
    from tests.engine import Engine, Task

    engine = Engine.create(tmp_path, {"t0": Task(["t0.txt"])})
    for key in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ray/auth_token either
    code = main(["--root", engine.root, "run", engine.slug, "--max-parallel", "1", "--lanes-dir",
                 str(tmp_path / "lanes"), "--executor", "claude-code", "--yes", "--runner", "ray://127.0.0.2:1"])
    out = capsys.readouterr()
    said = (out.out + out.err).strip().splitlines()
    assert code == 2 and len(said) == 1, said
    assert said[0].startswith("lanes-es run: runner_unavailable: the Ray cluster needs its token and no token is "
                              "set") and said[0].endswith("; nothing was confirmed"), said
    assert engine.deps.store.initiative(engine.slug) is None
    # The agent's program is the nodes', but the Lanes are this machine's: an unusable --lanes-dir is still refused
    monkeypatch.setenv("RAY_AUTH_TOKEN", "a-token")
    (tmp_path / "a-file").write_text("")
    code = main(["--root", engine.root, "run", engine.slug, "--max-parallel", "1", "--lanes-dir",
                 str(tmp_path / "a-file"), "--executor", "claude-code", "--yes", "--runner", "ray://127.0.0.2:1"])
    out = capsys.readouterr()
    assert code == 2 and "invalid_lanes_dir" in out.out + out.err, out
    assert engine.deps.store.initiative(engine.slug) is None


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_a_runner_that_cannot_be_used_is_refused_in_one_line(tmp_path: Path, store_url: str,
                                                             monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    """No cluster needed: a runner text that is not one is refused before anything is confirmed; a ray runner
    without its token is refused by the first tick, before anything is sent or recorded against a Lane."""
    from lanes_es.cli.main import main
    from tests.engine import Engine, Task

    engine = Engine.create(tmp_path, {"t0": Task(["t0.txt"])})
    assert main(["--root", engine.root, "authorize", engine.slug, "--yes", "--runner", "ray://head"]) == 2
    said = capsys.readouterr().err.strip().splitlines()
    assert said == ["lanes-es: invalid_runner: runner 'ray://head' names no host: write ray://HOST:PORT (the Ray "
                    "Client server); nothing was confirmed"], said
    assert engine.deps.store.initiative(engine.slug) is None
    for key in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ray/auth_token either
    monkeypatch.setenv("LANES_ES_RUNNER", "ray://127.0.0.2:1")  # the variable stands for --runner
    assert main(["--root", engine.root, "authorize", engine.slug, "--yes"]) == 0
    assert engine.deps.store.initiative(engine.slug).authorizations[-1].runner == "ray://127.0.0.2:1"
    capsys.readouterr()
    assert main(["--root", engine.root, "tick", engine.slug]) == 2
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and "the Ray cluster needs its token and no token is set" in said[0], said
