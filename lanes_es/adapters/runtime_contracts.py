"""The runtime contract check between the coordinator and a Lane (docs/upstream.md#the-runtime-contract-check).

The coordinator reads every Lane's kernel state with its own runtime, so the runtime a
Lane Executor loads must use the same contract identifiers; the comparison is on those
identifiers, never on a version number. Checked for a new batch before any Lane exists.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lanes_es.adapters.files import MiB, read_capped_text
from lanes_es.domain.jstext import parse_json

MAX_JSON_FILE_BYTES = MiB  # a manifest or a package.json, read from a Lane or the repository
MANIFEST_CONTRACT = "immune_brain/runtime_contracts/v1"
KEYS = ("task_record", "task_tombstone", "assurance_projection", "kernel_store_schema")
RUNTIME_CONTRACT_MISMATCH = "batch_runtime_contract_mismatch"
RUNNING_SOURCE = Path(__file__).resolve().parent.parent  # the lanes_es package this coordinator runs
RUNNING_MANIFEST = RUNNING_SOURCE / "runtime_contracts.json"
_CANDIDATES = ("runtime_contracts.json", "kernel/runtime_contracts.json", "runtime/kernel/runtime_contracts.json",
               "plugins/immune-brain/runtime/kernel/runtime_contracts.json")
MAX_SAFE_INTEGER = 2**53 - 1


class ManifestError(ValueError):
    pass


def read_runtime_contracts(directory: str | Path) -> tuple[Path, dict[str, Any]] | None:
    """The first manifest under `directory`, validated; None when there is none."""
    for candidate in _CANDIDATES:
        path = Path(directory) / candidate
        if path.is_file():
            return path, _validated(path)
    return None


def _validated(path: Path) -> dict[str, Any]:
    try:
        manifest = parse_json(read_capped_text(path, MAX_JSON_FILE_BYTES))
    except (OSError, ValueError):  # unreadable, not UTF-8 or JSON, nested too deeply, larger than any manifest
        raise ManifestError(f"{path} is not an {MANIFEST_CONTRACT} manifest") from None
    if not isinstance(manifest, dict) or manifest.get("contract") != MANIFEST_CONTRACT:
        raise ManifestError(f"{path} is not an {MANIFEST_CONTRACT} manifest")
    for key in KEYS[:3]:
        if not isinstance(manifest.get(key), str) or not manifest[key]:
            raise ManifestError(f"{path} has an invalid {key}")
    schema = manifest.get("kernel_store_schema")
    if not isinstance(schema, int) or isinstance(schema, bool) or abs(schema) > MAX_SAFE_INTEGER:
        raise ManifestError(f"{path} has an invalid kernel_store_schema")
    return {key: manifest[key] for key in KEYS}


def running_contracts() -> dict[str, Any]:
    return _validated(RUNNING_MANIFEST)


def differences(ours: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    return [f"{key}: {ours[key]} != {theirs[key]}" for key in KEYS if ours[key] != theirs[key]]


def lane_runtime_dir(root: str, explicit: str | None) -> str | None:
    """An explicit runtime dir, else the repository itself when it is the immune-brain package."""
    if explicit:
        return explicit
    try:
        package = parse_json(read_capped_text(Path(root) / "package.json", MAX_JSON_FILE_BYTES))
    except (OSError, ValueError):
        return None
    return root if isinstance(package, dict) and package.get("name") == "immune-brain" else None


class ManifestRuntimeContracts:
    """The tick's RuntimeContracts port."""

    def refusal(self, root: str, executor_runtime: str | None) -> str | None:
        directory = lane_runtime_dir(root, executor_runtime)
        if directory is None:
            return None
        try:
            found = read_runtime_contracts(directory)
        except ManifestError as error:
            return f"{RUNTIME_CONTRACT_MISMATCH}: {error}"
        if found is None:
            return f"{RUNTIME_CONTRACT_MISMATCH}: no runtime contract manifest under {executor_runtime}" \
                if executor_runtime else None
        path, theirs = found
        found_differences = differences(running_contracts(), theirs)
        if not found_differences:
            return None
        return (f"{RUNTIME_CONTRACT_MISMATCH}: coordinator runtime {RUNNING_SOURCE} and Lane runtime {path} disagree "
                f"({'; '.join(found_differences)}); load the same runtime on both sides before starting the batch")
