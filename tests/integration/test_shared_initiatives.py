"""Repositories sharing one store, on SQLite and PostgreSQL: an Initiative is keyed by its
repository (clone) too, so two repositories with the same slug each run their own batch;
Initiatives keyed by slug alone (stores from before repository ids) still load, in the
repository they belong to only; and two confirmations given at once never mint two batches."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lanes_es.adapters.store import EventStore
from lanes_es.adapters.store_open import repository_id
from lanes_es.domain.initiative import Initiative, initiative_id
from tests.engine import Engine, Task
from tests.gitfixtures import run_git
from tools.cli import main

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
        assert engine.service.initiative(SLUG).batch_ids() == [own]
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
    legacy_initiative(store, SLUG, owner.root, f"batch-{SLUG}-old", owner.service.confirmation(SLUG))
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
    assert other.service.initiative(SLUG).batch_ids() != [f"batch-{SLUG}-old"]


def test_two_first_commands_at_once_agree_on_one_repository_id(tmp_path):
    common = tmp_path / "common"
    script = ("import sys; from pathlib import Path; from lanes_es.adapters.store_open import repository_id; "
              "print(repository_id(Path(sys.argv[1]), create=True))")
    processes = [subprocess.Popen([sys.executable, "-c", script, str(common)], stdout=subprocess.PIPE, text=True)
                 for _ in range(6)]
    ids = {process.communicate(timeout=60)[0].strip() for process in processes}
    assert len(ids) == 1 and len(ids.pop()) == 32
    assert [path.name for path in (common / "lanes-es").iterdir()] == ["repository-id"]
