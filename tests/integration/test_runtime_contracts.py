"""The runtime contract check on real repositories (issue 3): a new lane batch whose Lane runtime
writes other contracts is refused before any Lane exists, naming both sources, with nothing
written (LANE-RTC-02); matching identifiers start normally (LANE-RTC-03); a missing manifest
under an explicit runtime dir is refused, and without one the check runs only in the
immune-brain repository itself (LANE-RTC-05)."""

from __future__ import annotations

import json
from pathlib import Path

from lanes_es.adapters.runtime_contracts import RUNNING_MANIFEST, RUNNING_SOURCE
from tests.engine import Engine, Task
from tests.engine_more import batch_files, make_engine, state_bytes
from tests.gitfixtures import git_out
import pytest
from lanes_es.usecases.tick import tick

# Every test here goes through the store: run each on SQLite and on PostgreSQL (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("store_url")

V3 = "assurance_kernel/task_record/v3"


def runtime_dir(tmp_path: Path, relative: str = "runtime_contracts.json", **changes: object) -> Path:
    """A Lane runtime dir whose manifest is the running one with `changes`."""
    directory = tmp_path / "executor-runtime"
    manifest = {**json.loads(RUNNING_MANIFEST.read_text()), **changes}
    target = directory / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(manifest, indent=2) + "\n")
    return directory


def single(tmp_path: Path, files: dict[str, str] | None = None) -> Engine:
    engine = make_engine(tmp_path, {"task-a": Task(["a.txt"])}, files=files)
    engine.authorize()
    return engine


def assert_nothing_started(engine: Engine, base: str, result) -> None:
    assert (result.report["batch_state"], result.written) == ("rejected", False)
    assert result.report["handoffs"] == []
    assert engine.batch is None and batch_files(engine) == {}
    assert git_out(engine.root, "rev-parse", "HEAD") == base
    assert git_out(engine.root, "rev-parse", "--abbrev-ref", "HEAD") == "main"
    assert git_out(engine.root, "branch", "--list", "imm/*") == ""


def test_a_new_batch_is_refused_before_any_lane_exists_when_the_lane_runtime_differs(tmp_path):  # LANE-RTC-02
    engine = single(tmp_path)
    base = git_out(engine.root, "rev-parse", "HEAD")
    directory = runtime_dir(tmp_path, task_record=V3)
    result = tick(engine.deps, engine.slug, executor_runtime=str(directory))
    reason = result.report["reason"]
    assert reason.startswith("batch_runtime_contract_mismatch: ")
    assert f"task_record: assurance_kernel/task_record/v4 != {V3}" in reason
    assert f"Lane runtime {directory}/runtime_contracts.json" in reason
    assert f"coordinator runtime {RUNNING_SOURCE}" in reason
    assert reason.endswith("; load the same runtime on both sides before starting the batch")
    assert_nothing_started(engine, base, result)


def test_matching_identifiers_start_normally(tmp_path):  # LANE-RTC-03
    engine = single(tmp_path)
    directory = runtime_dir(tmp_path, "runtime/kernel/runtime_contracts.json")
    result = tick(engine.deps, engine.slug, executor_runtime=str(directory))
    assert result.report["batch_state"] == "running"
    assert [h["role"] for h in result.report["handoffs"]] == ["lane-steward"]


def test_an_explicit_runtime_dir_without_a_manifest_or_with_a_broken_one_is_refused(tmp_path):  # LANE-RTC-05
    engine = single(tmp_path)
    base = git_out(engine.root, "rev-parse", "HEAD")
    empty = tmp_path / "empty-runtime"
    empty.mkdir()
    result = tick(engine.deps, engine.slug, executor_runtime=str(empty))
    assert result.report["reason"] == f"batch_runtime_contract_mismatch: no runtime contract manifest under {empty}"
    assert_nothing_started(engine, base, result)
    broken = runtime_dir(tmp_path, contract="immune_brain/runtime_contracts/v0")
    result = tick(engine.deps, engine.slug, executor_runtime=str(broken))
    assert result.report["reason"] == (f"batch_runtime_contract_mismatch: {broken}/runtime_contracts.json is not an "
                                       "immune_brain/runtime_contracts/v1 manifest")
    assert_nothing_started(engine, base, result)


def test_without_an_explicit_dir_only_the_immune_brain_repository_is_compared(tmp_path):  # LANE-RTC-05
    manifest = {**json.loads(RUNNING_MANIFEST.read_text()), "kernel_store_schema": 2}
    engine = single(tmp_path, files={"package.json": json.dumps({"name": "immune-brain"}) + "\n",
                                     "plugins/immune-brain/runtime/kernel/runtime_contracts.json":
                                         json.dumps(manifest, indent=2) + "\n"})
    result = tick(engine.deps, engine.slug)
    assert result.report["reason"].startswith("batch_runtime_contract_mismatch: ")
    assert "(kernel_store_schema: 1 != 2)" in result.report["reason"]
    assert f"{engine.root}/plugins/immune-brain/runtime/kernel/runtime_contracts.json" in result.report["reason"]
    assert engine.batch is None


def test_the_check_runs_only_for_a_new_batch(tmp_path):
    engine = single(tmp_path)
    engine.tick()
    recorded = state_bytes(engine)
    result = tick(engine.deps, engine.slug, executor_runtime=str(runtime_dir(tmp_path, task_record=V3)))
    assert result.report["batch_state"] == "running"
    assert state_bytes(engine) == recorded


def test_the_cli_passes_the_executor_runtime(tmp_path, capsys):
    from lanes_es.cli.main import main

    engine = single(tmp_path)
    directory = runtime_dir(tmp_path, task_record=V3)
    code = main(["--root", engine.root, "tick", engine.slug, "--executor-runtime", str(directory), "--json"])
    assert code == 2
    report = json.loads(capsys.readouterr().out)
    assert report["batch_state"] == "rejected" and report["reason"].startswith("batch_runtime_contract_mismatch: ")
    assert engine.batch is None


def test_the_shipped_manifest_names_the_contracts_this_runtime_writes(tmp_path):  # LANE-RTC-01, ported
    from lanes_es.adapters.runtime_contracts import ManifestRuntimeContracts, read_runtime_contracts, running_contracts
    from lanes_es.domain.audit_pair import TASK_RECORD_CONTRACT, TOMBSTONE_CONTRACT

    path, contracts = read_runtime_contracts(RUNNING_SOURCE)
    assert path == RUNNING_MANIFEST and contracts == running_contracts()
    assert (contracts["task_record"], contracts["task_tombstone"]) == (TASK_RECORD_CONTRACT, TOMBSTONE_CONTRACT)
    # a Lane Executor that loads this very package is the same runtime
    assert ManifestRuntimeContracts().refusal(str(tmp_path), str(RUNNING_SOURCE)) is None
