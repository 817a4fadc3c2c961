"""`lanes-es authorize` reads the plan, the repository and HEAD again after the user's answer (upstream's
checks after its native gate, docs/upstream.md#reason-codes, #authorization-reuse-and-the-tool-surface): a yes is recorded only when none
moved while the prompt was open. Each move is made while a real `lanes-es authorize` subprocess
waits at its prompt on a pseudo-terminal this test answers; the refusal is upstream's key, exit 2,
and nothing is written (no Initiative in the store, no branch).
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from lanes_es.adapters.store_open import repository_id
from tests.engine import Task
from tests.engine_more import make_engine
from tests.gitfixtures import all_refs, git_out, run_git
from tests.integration.world_moves import edit_initiative, move_branch
from lanes_es.usecases.load import initiative

PROJECT = Path(__file__).resolve().parents[2]
PROMPT = b"Confirm this batch as the literal user? [y/N] "
pytestmark = pytest.mark.usefixtures("store_url")  # each test once on SQLite, once on PostgreSQL


def authorize_moving(root: str, slug: str, move: Callable[[], object]) -> tuple[int, str, str]:
    """`lanes-es authorize SLUG` on a terminal: `move` runs while it waits at its prompt, then the user says yes."""
    master, slave = os.openpty()
    process = subprocess.Popen([sys.executable, "-m", "lanes_es.cli.main", "--root", root, "authorize", slug],
                               cwd=PROJECT, stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    os.close(slave)
    shown = b""
    try:
        while not shown.endswith(PROMPT):
            if not select.select([process.stdout], [], [], 120)[0]:  # a guard against a hung child
                process.kill()
                raise AssertionError(f"no prompt within 120 s; it showed {shown[-400:]!r}")
            chunk = os.read(process.stdout.fileno(), 65536)
            if not chunk:
                raise AssertionError(f"exited before the prompt: {shown!r} {process.stderr.read()!r}")
            shown += chunk
        move()
        os.write(master, b"y\n")
        rest, err = process.communicate(timeout=120)
    finally:
        os.close(master)
    return process.returncode, (shown + rest).decode(), err.decode()


def engine_for(tmp_path: Path):
    return make_engine(tmp_path, {"s1": Task(["one.txt"]), "s2": Task(["two.txt"])})


def refused_writing_nothing(engine, code: int, err: str, key: str, refs: str) -> None:
    assert code == 2, err
    (line,) = err.strip().splitlines()  # one line, no traceback
    assert line.startswith(f"lanes-es: {key}: ") and "nothing was recorded" in line, line
    assert f"lanes-es authorize {engine.slug}" in line
    assert initiative(engine.deps, engine.slug) is None  # not even an Initiative registered
    assert all_refs(engine.root) == refs and "refs/heads/imm/" not in refs and not Path(engine.root, ".imm/state/batches").exists()


def test_an_unmoved_world_is_confirmed_and_the_prompt_shows_the_checkout(tmp_path):
    engine = engine_for(tmp_path)
    code, out, err = authorize_moving(engine.root, engine.slug, lambda: None)
    assert code == 0, err
    facts = json.loads(out[:out.rindex("}") + 1])
    assert facts["repository"] == engine.root  # the checkout the user confirms the batch for
    assert out.rstrip().endswith(PROMPT.decode() + initiative(engine.deps, engine.slug).current.batch_id)
    assert initiative(engine.deps, engine.slug).current.repository == engine.root


def test_a_plan_changed_during_the_prompt_is_refused_as_plan_changed(tmp_path):
    engine = engine_for(tmp_path)
    code, _, err = authorize_moving(engine.root, engine.slug, lambda: edit_initiative(engine.root, engine.slug))
    refused_writing_nothing(engine, code, err, "plan_changed", all_refs(engine.root))
    assert "changed after the confirmation" in err


def test_a_plan_that_became_unreadable_during_the_prompt_is_refused(tmp_path):
    engine = engine_for(tmp_path)
    refs = all_refs(engine.root)
    initiative = Path(engine.root, f"docs/initiatives/{engine.slug}.md")
    code, _, err = authorize_moving(engine.root, engine.slug, initiative.unlink)
    refused_writing_nothing(engine, code, err, "plan_became_unreadable", refs)


def test_a_head_moved_during_the_prompt_is_refused_as_head_moved(tmp_path):
    engine = engine_for(tmp_path)
    head = git_out(engine.root, "rev-parse", "HEAD")
    code, _, err = authorize_moving(engine.root, engine.slug, lambda: move_branch(engine.root))
    moved = git_out(engine.root, "rev-parse", "HEAD")
    assert moved != head
    refused_writing_nothing(engine, code, err, "head_moved", all_refs(engine.root))
    assert f"from {head} to {moved}" in err


def test_a_repository_that_became_unreadable_during_the_prompt_is_refused(tmp_path):
    """The repository id is garbled while the prompt is open (edited outside lanes-es): the repository the
    user confirmed in can no longer be read as it was."""
    engine = engine_for(tmp_path)
    refs = all_refs(engine.root)
    id_file = Path(git_out(engine.root, "rev-parse", "--path-format=absolute", "--git-common-dir"),
                   "lanes-es", "repository-id")
    made = repository_id(id_file.parent.parent, create=True)  # a clone with an id (made by its first append)
    assert engine.deps.store.repository_id == made
    code, _, err = authorize_moving(engine.root, engine.slug, lambda: id_file.write_text("not an id\n"))
    refused_writing_nothing(engine, code, err, "repository_became_unreadable", refs)


def test_a_repository_id_replaced_during_the_prompt_is_another_repository(tmp_path):
    """Another valid id while the prompt is open (the file deleted and made again): the Initiative would be
    keyed by a repository the user did not confirm in: batch_repository_changed (lanes-es's own code)."""
    engine = engine_for(tmp_path)
    refs = all_refs(engine.root)
    id_file = Path(git_out(engine.root, "rev-parse", "--path-format=absolute", "--git-common-dir"),
                   "lanes-es", "repository-id")
    made = repository_id(id_file.parent.parent, create=True)  # a clone with an id (made by its first append)
    assert engine.deps.store.repository_id == made
    code, _, err = authorize_moving(engine.root, engine.slug, lambda: id_file.write_text("f" * 32 + "\n"))
    refused_writing_nothing(engine, code, err, "batch_repository_changed", refs)


def _running(engine) -> None:
    engine.authorize()
    engine.tick()


def _parked(engine) -> None:
    from tests.engine_more import correction_rounds_then_park, enroll

    engine.authorize(qa_failure_limit=1)
    enroll(engine, "s1")
    correction_rounds_then_park(engine, "s1")  # s1's QA fails (one.txt never appears); s2 waits on it
    assert engine.batch.batch_state == "needs_human"


def _unblock_s2(engine) -> None:
    """The user re-plans: s2 no longer waits on s1 (committed on the batch branch, as a user would)."""
    path = Path(engine.root, f"docs/initiatives/{engine.slug}.md")
    path.write_text(path.read_text().replace("Blocked by: s1\n\n", ""))
    run_git(engine.root, "commit", "-q", "-am", "s2 no longer waits on s1")


@pytest.mark.parametrize("recorded, move, key", [
    (_running, "plan", "plan_changed"), (_parked, "plan", "plan_changed"),
    (_running, "head", "head_moved"), (_parked, "head", "head_moved")],
    ids=["running-plan", "parked-plan", "running-head", "parked-head"])
def test_re_confirming_a_recorded_batch_checks_again_after_the_answer(tmp_path, recorded, move, key):
    """A fresh confirmation of a running or parked batch (the resume path) is read again after the user's
    answer like a first one: a plan edited or a HEAD moved while the prompt was open is refused with the
    same key, and nothing is recorded: no new authorization, no event on the batch, its record as it was."""
    from tests.engine_more import needs_file

    engine = make_engine(tmp_path, {"s1": Task(["one.txt"], verification=needs_file("one.txt")),
                                    "s2": Task(["two.txt"], blocked_by=["s1"])})
    recorded(engine)
    authorizations = len(initiative(engine.deps, engine.slug).authorizations)
    events = len(list(engine.deps.store.events(engine.batch.id)))
    state = Path(engine.root, f".imm/state/batches/{engine.batch.id}.json").read_bytes()
    moving = (lambda: _unblock_s2(engine)) if move == "plan" else (lambda: move_branch(engine.root))
    code, _, err = authorize_moving(engine.root, engine.slug, moving)
    assert code == 2, err
    (line,) = err.strip().splitlines()
    assert line.startswith(f"lanes-es: {key}: ") and f"lanes-es authorize {engine.slug}" in line, line
    assert len(initiative(engine.deps, engine.slug).authorizations) == authorizations
    assert len(list(engine.deps.store.events(engine.batch.id))) == events
    assert Path(engine.root, f".imm/state/batches/{engine.batch.id}.json").read_bytes() == state
