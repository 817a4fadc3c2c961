"""`verify --expect-head`: a log cut short still chains, so only a head kept elsewhere shows the loss."""

from __future__ import annotations

import re
from pathlib import Path

from tests.engine import Engine, Task
from tests.store_rows import StoreRows
from lanes_es.cli.main import main


def test_a_log_cut_short_fails_against_the_head_recorded_before(tmp_path, capsys, store_url):
    engine = Engine.create(tmp_path, {"task-a": Task(["a.txt"]), "task-b": Task(["b.txt"])})
    batch_id = engine.authorize(max_parallel=2)
    report = engine.tick()
    engine.tick(offers={t: engine.provision(t, report) for t in ("task-a", "task-b")})
    capsys.readouterr()
    assert main(["--root", engine.root, "verify", batch_id]) == 0
    head = re.search(r"chain head (\w+)", capsys.readouterr().out).group(1)
    assert main(["--root", engine.root, "verify", batch_id, "--expect-head", head]) == 0
    capsys.readouterr()
    engine.deps.store.close()
    rows = StoreRows(store_url)
    [(newest,)] = rows.query("SELECT MAX(originator_version) FROM {events} WHERE originator_id=?", batch_id)
    assert rows.execute("DELETE FROM {events} WHERE originator_id=? AND originator_version=?", batch_id, newest) == 1
    (Path(engine.root) / ".imm/state/batches" / f"{batch_id}.json").unlink()  # the files go with it
    # A damaged log is rebuilt by nothing: rebuild refuses it and points to verify (the anchored size
    # shows the cut too).
    assert main(["--root", engine.root, "rebuild", batch_id]) == 2
    assert f"lanes-es verify {batch_id}" in capsys.readouterr().err
    assert main(["--root", engine.root, "verify", batch_id, "--expect-head", head]) == 1
    out = capsys.readouterr().out
    assert "head_mismatch" in out and head in out
