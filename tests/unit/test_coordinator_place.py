"""Where a batch's coordinator is (lanes_es/usecases/coordinator.py), over fakes of the store and of the
coordinator worktrees' port: what the log records decides, and a choice applies to a new batch only."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from lanes_es.errors import ServiceError
from lanes_es.usecases.coordinator import at_coordinator, default_place, for_new_batch
from lanes_es.usecases.deps import Deps
from tests.unit.fakes import SLUG, authorization, plan_children


class Worktrees:
    """The port, recording what it was asked; `restore` makes the directory, as git would."""

    def __init__(self) -> None:
        self.prepared: list[str] = []
        self.restored: list[str] = []

    def prepare(self, repo_root: str, path: str, branch: str, head: str, slug: str) -> None:
        self.prepared.append(path)

    def restore(self, repo_root: str, path: str, branch: str, base_head: str) -> bool:
        self.restored.append(path)
        Path(path).mkdir(parents=True)
        (Path(path) / ".git").write_text("gitdir: elsewhere\n")
        return True


def deps_with(tmp_path: Path, authorized: Any = None, state: str | None = None) -> Deps:
    worktrees = Worktrees()
    adapters = SimpleNamespace(coordinators=lambda: worktrees, head=lambda root: "b" * 40, common_dir=None)
    store = SimpleNamespace(
        initiative=lambda slug: SimpleNamespace(current=authorized) if authorized else None,
        batch=lambda batch_id: SimpleNamespace(batch_state=state) if state else None)
    user = tmp_path / "checkout"
    user.mkdir(exist_ok=True)
    return Deps(root=str(user), store=store, adapters=adapters, now=lambda: "now")  # type: ignore[arg-type]


def recorded(tmp_path: Path, coordinator: str | None) -> Any:
    return msgspec.structs.replace(authorization(plan_children(("a", []))), repository=str(tmp_path / "checkout"),
                   coordinator=coordinator)


def test_a_batch_recorded_in_place_goes_on_in_place(tmp_path, monkeypatch):
    monkeypatch.delenv("LANES_ES_COORDINATOR", raising=False)
    deps = deps_with(tmp_path, recorded(tmp_path, None), "running")
    assert at_coordinator(deps, deps.store.initiative(SLUG).current) is deps
    assert for_new_batch(deps, SLUG) is deps  # no worktree made for it: its log says where it runs
    assert deps.adapters.coordinators().prepared == []


def test_a_recorded_worktree_roots_every_command_there_with_the_users_checkout_kept(tmp_path):
    place = tmp_path / "coordinator"
    place.mkdir()
    (place / ".git").write_text("gitdir: elsewhere\n")
    deps = deps_with(tmp_path, recorded(tmp_path, str(place)), "running")
    there = at_coordinator(deps, deps.store.initiative(SLUG).current)
    assert (there.root, there.checkout, there.user_checkout) == (str(place), deps.root, deps.root)
    assert there.repository_opened().checkout == deps.root  # the repository guard compares the user's checkout
    assert at_coordinator(there, deps.store.initiative(SLUG).current) == there


def test_a_removed_worktree_is_made_again_for_a_running_batch_and_refused_otherwise(tmp_path):
    place = tmp_path / "coordinator"
    deps = deps_with(tmp_path, recorded(tmp_path, str(place)), "running")
    with pytest.raises(ServiceError) as refused:
        at_coordinator(deps, deps.store.initiative(SLUG).current)
    assert refused.value.code == "coordinator_removed"
    there = at_coordinator(deps, deps.store.initiative(SLUG).current, restore=True)
    assert there.root == str(place) and deps.adapters.coordinators().restored == [str(place)]


@pytest.mark.parametrize("where, expected", [(None, "default"), (".", "in place"), ("elsewhere", "elsewhere")])
def test_a_new_batch_goes_where_it_is_asked_to(tmp_path, monkeypatch, where, expected):
    monkeypatch.delenv("LANES_ES_COORDINATOR", raising=False)
    monkeypatch.chdir(tmp_path)
    deps = deps_with(tmp_path, recorded(tmp_path, None), "completed")  # the last batch ended: a new one
    chosen = for_new_batch(deps, SLUG, where)
    place = {"default": default_place(deps, SLUG), "elsewhere": tmp_path / "elsewhere"}.get(expected)
    assert chosen.root == (str(place) if place else deps.root)
    assert deps.adapters.coordinators().prepared == ([str(place)] if place else [])


def test_the_environment_sets_the_default_to_in_place(tmp_path, monkeypatch):
    monkeypatch.setenv("LANES_ES_COORDINATOR", ".")
    deps = deps_with(tmp_path)
    assert for_new_batch(deps, SLUG) is deps
