"""Repositories sharing one store, on SQLite and PostgreSQL: an Initiative is keyed by its
repository (clone) too, so two repositories with the same slug each run their own batch;
Initiatives keyed by slug alone (stores from before repository ids) still load, in the
repository they belong to only; and two confirmations given at once never mint two batches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lanes_es.adapters.store import EventStore
from lanes_es.adapters.store_open import repository_id
from lanes_es.domain.initiative import Initiative, initiative_id
from tests.engine import Engine, Task
from tests.gitfixtures import coordinator, run_git
from lanes_es.cli.main import main
from lanes_es.usecases.authorize import authorize
from lanes_es.usecases.confirmation import BatchOptions, prepare_confirmation
from lanes_es.usecases.load import initiative

pytestmark = pytest.mark.coordinator_worktree

SLUG = "shared"


def cli(root: str, *argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["--root", root, *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def run_batch_through_the_cli(engine: Engine, deliveries: dict[str, tuple[str, str]], capsys) -> str:
    """authorize, then tick as the steward and Executor would until the batch settles."""
    code, out, err = cli(engine.root, "authorize", engine.slug, "--yes", capsys=capsys)
    assert code == 0, err
    batch_id = out.strip()
    offers: list[str] = []
    for _ in range(20):
        code, out, err = cli(engine.root, "tick", engine.slug, "--json", *offers, capsys=capsys)
        report = json.loads(out)
        if report["batch_state"] != "running":
            assert code == 0 and report["batch_state"] == "completed", (report, err)
            return batch_id
        offers = []
        for handoff in report["handoffs"]:
            task_id = handoff["task_id"]
            if handoff.get("action") == "provision":
                offers += ["--offer", f"{task_id}={engine.provision(task_id, report)}"]
            elif handoff.get("action") == "release":
                engine.release(task_id)
            elif handoff["role"] == "executor":
                engine.deliver(task_id, *deliveries[task_id])
    raise AssertionError("the batch did not settle")


def test_two_repositories_with_one_slug_each_run_their_own_batch_on_one_store(tmp_path, store_url, capsys):
    alpha = Engine.create(tmp_path / "alpha", {"task-a": Task(["a.txt"])}, slug=SLUG, store_url=store_url)
    beta = Engine.create(tmp_path / "beta", {"task-b": Task(["b.txt"])}, slug=SLUG, store_url=store_url)

    alpha_id = run_batch_through_the_cli(alpha, {"task-a": ("a.txt", "alpha\n")}, capsys)
    beta_id = run_batch_through_the_cli(beta, {"task-b": ("b.txt", "beta\n")}, capsys)

    assert alpha_id != beta_id
    code, out, _ = cli(alpha.root, "batches", "--json", capsys=capsys)
    assert code == 0
    lines = {line["batch_id"]: line for line in json.loads(out)}
    assert {batch_id: (line["initiative_slug"], line["repository"], line["batch_state"], line["children"])
            for batch_id, line in lines.items()} == {
        alpha_id: (SLUG, alpha.root, "completed", {"integrated": 1}),
        beta_id: (SLUG, beta.root, "completed", {"integrated": 1}),
    }
    # each repository sees its own Initiative, with its own batch and branch
    for engine, own, task in ((alpha, alpha_id, "task-a"), (beta, beta_id, "task-b")):
        code, out, _ = cli(engine.root, "status", SLUG, "--json", capsys=capsys)
        assert code == 0 and json.loads(out)["batch_id"] == own
        assert initiative(engine.deps, SLUG).batch_ids() == [own]
        assert [child["task_id"] for child in engine.batch.record["children"]] == [task]
    assert alpha.subjects(alpha.batch.record["base_head"]) != beta.subjects(beta.batch.record["base_head"])
    assert sorted(EventStore(store_url).batch_ids()) == sorted([alpha_id, beta_id])


def test_a_worktree_of_a_repository_shares_its_initiative_and_a_clone_does_not(tmp_path, store_url, capsys):
    engine = Engine.create(tmp_path / "origin", {"task-a": Task(["a.txt"])}, slug=SLUG, store_url=store_url)
    code, out, _ = cli(engine.root, "authorize", SLUG, "--yes", capsys=capsys)
    assert code == 0
    batch_id = out.strip()
    worktree = str(tmp_path / "second-worktree")
    run_git(engine.root, "worktree", "add", "--detach", worktree)
    code, out, _ = cli(worktree, "status", SLUG, "--json", capsys=capsys)
    assert code == 0 and json.loads(out)["batch_id"] == batch_id

    clone = str(tmp_path / "clone")
    run_git(str(tmp_path), "clone", "-q", engine.root, clone)
    code, out, err = cli(clone, "status", SLUG, "--json", capsys=capsys)
    assert code != 0 or json.loads(out).get("batch_id") != batch_id, (out, err)
    code, out, err = cli(clone, "authorize", SLUG, "--yes", capsys=capsys)
    assert code == 0, err
    assert out.strip() != batch_id  # the clone's own batch, on its own branch


def legacy_initiative(store: EventStore, slug: str, repository: str | None, batch_id: str, facts) -> None:
    """An Initiative as stores before repository ids keyed it: `initiative:<slug>`."""
    at = "2026-01-01T00:00:00.000Z"
    initiative = Initiative.register(at=at, slug=slug)
    assert initiative.id == initiative_id(slug) == f"initiative:{slug}"
    initiative.authorize(at=at, batch_id=batch_id, plan_digest=facts.plan_digest, base_head=facts.base_head,
                         branch=f"imm/{slug}", budget=facts.budget, max_parallel=1, children=facts.children,
                         confirmation_ref="legacy", final_verification=None, delegate_revisions=False, resumes=False,
                         repository=repository, integration="serial")
    store.save(initiative)


def test_an_initiative_keyed_by_slug_alone_still_loads_in_its_own_repository_only(tmp_path, store_url, capsys):
    owner = Engine.create(tmp_path / "owner", {"task-a": Task(["a.txt"])}, slug=SLUG, store_url=store_url)
    other = Engine.create(tmp_path / "other", {"task-a": Task(["a.txt"])}, slug=SLUG, store_url=store_url)
    store = EventStore(store_url)
    legacy_initiative(store, SLUG, owner.root, f"batch-{SLUG}-old", prepare_confirmation(owner.deps, SLUG))
    store.close()

    # the owner (the checkout the old authorization recorded) ticks the old batch on
    code, out, err = cli(owner.root, "tick", SLUG, "--json", capsys=capsys)
    assert code == 0, err
    assert json.loads(out)["batch_id"] == f"batch-{SLUG}-old"
    # another repository with the same slug does not see it, and starts its own
    code, out, err = cli(other.root, "authorize", SLUG, "--yes", capsys=capsys)
    assert code == 0, err
    assert out.strip() != f"batch-{SLUG}-old"
    # a fresh confirmation in the owner claims the old Initiative for it, keyed as it was
    code, out, err = cli(owner.root, "authorize", SLUG, "--yes", capsys=capsys)
    assert code == 0, err
    assert out.strip() == f"batch-{SLUG}-old"
    legacy = EventStore(store_url)._aggregate(initiative_id(SLUG))
    assert legacy.owner == repository_id(Path(owner.root) / ".git", create=False)
    assert initiative(other.deps, SLUG).batch_ids() != [f"batch-{SLUG}-old"]


def test_two_first_commands_at_once_agree_on_one_repository_id(tmp_path):
    common = tmp_path / "common"
    script = ("import sys; from pathlib import Path; from lanes_es.adapters.store_open import repository_id; "
              "print(repository_id(Path(sys.argv[1]), create=True))")
    processes = [subprocess.Popen([sys.executable, "-c", script, str(common)], stdout=subprocess.PIPE, text=True)
                 for _ in range(6)]
    ids = {process.communicate(timeout=60)[0].strip() for process in processes}
    assert len(ids) == 1 and len(ids.pop()) == 32
    assert [path.name for path in (common / "lanes-es").iterdir()] == ["repository-id"]


# ---------------------------------------------------------------- confirmations given at once


def test_confirmations_given_at_once_by_several_processes_start_one_batch(tmp_path, store_url, capsys):
    engine = Engine.create(tmp_path, {"task-a": Task(["a.txt"]), "task-b": Task(["b.txt"])}, slug=SLUG,
                           store_url=store_url)
    store = engine.deps.store
    command = [sys.executable, "-m", "lanes_es.cli.main", "--root", engine.root, "authorize", SLUG, "--yes", "--json"]
    other = EventStore(store.url, lock_dir=store.lock_dir)
    try:
        # Each process decides its confirmation (minting a batch id) before it waits for the lock held
        # here; released, they record one after another, each on what the one before it wrote.
        with other.batch_lock(store.initiative_lock_name(SLUG)):
            processes = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                         for _ in range(4)]
            time.sleep(2.5)
    finally:
        other.close()
    outputs = [process.communicate(timeout=120) for process in processes]
    results = [(process.returncode, *output) for process, output in zip(processes, outputs)]
    assert all(code == 0 for code, _, _ in results), results
    printed = {json.loads(out)["batch_id"] for _, out, _ in results}
    found = initiative(engine.deps, SLUG)
    assert len(printed) == 1 and found.batch_ids() == list(printed)
    code, out, err = cli(engine.root, "tick", SLUG, "--json", capsys=capsys)
    assert code == 0, err
    assert json.loads(out)["batch_state"] == "running"


def test_an_authorization_whose_append_lost_the_race_rereads_and_records_nothing_twice(tmp_path, store_url):
    engine = Engine.create(tmp_path, {"task-a": Task(["a.txt"])}, slug=SLUG, store_url=store_url)
    store = engine.deps.store
    mine = prepare_confirmation(engine.deps, SLUG)
    theirs = prepare_confirmation(engine.deps, SLUG)
    assert mine.batch_id != theirs.batch_id  # each decided on an Initiative with no batch yet

    save = store.save

    def save_after_the_other_writer(*aggregates):
        # A writer that bypassed the lock appends its confirmation between this one's read and its append.
        store.save = save
        writer = EventStore(store.url, repository_id=store.repository_id)
        initiative = writer.new_initiative("2026-01-01T00:00:00.000Z", SLUG)
        initiative.authorize(at="2026-01-01T00:00:00.000Z", batch_id=theirs.batch_id, plan_digest=theirs.plan_digest,
                             base_head=theirs.base_head, branch=f"imm/{SLUG}", budget=theirs.budget,
                             max_parallel=theirs.max_parallel, children=theirs.children, confirmation_ref="theirs",
                             final_verification=None, delegate_revisions=False, resumes=False,
                             repository_id=store.repository_id)
        writer.save(initiative)
        writer.close()
        return save(*aggregates)

    store.save = save_after_the_other_writer
    recorded = authorize(engine.deps, mine)
    assert recorded.batch_id == theirs.batch_id  # the same yes, given twice: the first one stands
    assert initiative(engine.deps, SLUG).batch_ids() == [theirs.batch_id]
    aggregate = initiative(engine.deps, SLUG).id
    assert [row.originator_version for row in store.stored_events(aggregate)] == [1, 2]


def test_a_confirmation_overtaken_by_a_different_one_is_refused_and_writes_nothing(tmp_path, store_url, capsys):
    engine = Engine.create(tmp_path, {"task-a": Task(["a.txt"]), "task-b": Task(["b.txt"])}, slug=SLUG,
                           store_url=store_url)
    mine = prepare_confirmation(engine.deps, SLUG, BatchOptions(max_parallel=1))
    code, out, err = cli(engine.root, "authorize", SLUG, "--yes", "--max-parallel", "2", capsys=capsys)
    assert code == 0, err
    theirs = out.strip()
    aggregate = initiative(engine.deps, SLUG).id
    before = engine.deps.store.stored_events(aggregate)
    from lanes_es.errors import ServiceError

    with pytest.raises(ServiceError) as refused:
        authorize(engine.deps, mine)
    assert refused.value.code == "confirmation_superseded"
    assert theirs in str(refused.value) and f"lanes-es authorize {SLUG}" in str(refused.value)
    assert engine.deps.store.stored_events(aggregate) == before


# ---------------------------------------------------------------- SQLite's busy timeout


@pytest.mark.parametrize("command", ["authorize", "tick"])
def test_a_write_held_past_the_sqlite_busy_timeout_is_the_busy_outcome(tmp_path, command):
    """SQLite only: its writers queue on the file's write lock for the busy timeout (PostgreSQL has none;
    its appends wait on row locks of their own batch, which the batch lock keeps to one tick)."""
    import sqlite3

    store_path = tmp_path / "store" / "events.sqlite"
    store_path.parent.mkdir()  # a store is never made in a directory that does not exist
    engine = Engine.create(tmp_path, {"task-a": Task(["a.txt"])}, slug=SLUG, store_url=str(store_path))
    EventStore(str(store_path)).close()  # the store as an earlier command left it (a first append makes it)
    if command == "tick":
        engine.authorize()
        engine.tick()  # the batch runs; the next tick has an offer to record
        lane = engine.provision("task-a", engine.tick())
        argv = ["tick", SLUG, "--offer", f"task-a={lane}"]
    else:
        argv = ["authorize", SLUG, "--yes"]
    rows = lambda: sqlite3.connect(store_path).execute("SELECT COUNT(*) FROM stored_events").fetchone()[0]
    before = rows()
    state_dir = Path(engine.root) / ".imm" / "state" / "batches"
    projections = {path.name: path.read_bytes() for path in state_dir.glob("*.json")} if state_dir.exists() else {}
    holder = sqlite3.connect(store_path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another writer's transaction, held past the timeout
    try:
        done = subprocess.run([str(Path(sys.prefix) / "bin" / "lanes-es"), "--root", engine.root, "--store",
                               str(store_path), *argv], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "LANES_ES_SQLITE_BUSY_SECONDS": "1"})
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "stayed locked by other writers for 1 s" in lines[0] and "nothing was written" in lines[0]
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr
    assert rows() == before
    assert {path.name: path.read_bytes() for path in state_dir.glob("*.json")} == projections
    assert not coordinator(engine.root, SLUG).exists()  # a refused confirmation leaves no coordinator worktree
