"""A refusal writes only its audit event (and the checkpoint that anchors it), through the real command line,
on both backends, and says so on stderr in CLI words."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lanes_es.exit_codes import EXIT_REFUSED
from tests.integration.test_user_errors import SLUG, lanes, rows, started
from tests.store_rows import StoreRows, store_url_of

pytestmark = pytest.mark.usefixtures("store_url")  # each test once on SQLite, once on PostgreSQL


@pytest.fixture
def repo(plain_repo: Path) -> Path:
    return plain_repo  # the demo's repository (tests/integration/conftest.py), its store the test's


def test_a_rejected_tick_says_so_on_stderr_in_cli_words_and_records_only_the_refusal(repo):
    batch_id = started(repo)
    before = rows(repo)

    refused = lanes(repo, "tick", SLUG, "--max-parallel", "3")
    as_json = lanes(repo, "tick", SLUG, "--max-parallel", "3", "--json")

    assert refused.returncode == EXIT_REFUSED and refused.stdout == "", refused.stdout
    line = refused.stderr.strip()
    assert "\n" not in line and "Traceback" not in line, line
    assert line.startswith("lanes-es: tick refused: batch_parallel_mismatch: the recorded batch runs with "
                           "max_parallel 2; nothing was changed"), line
    assert line.endswith(f"next: fix what the reason names, then `lanes-es tick {SLUG}`"), line
    assert "start_unattended_batch" not in line, line
    assert as_json.returncode == EXIT_REFUSED and as_json.stderr.strip().startswith("lanes-es: tick refused: ")
    assert json.loads(as_json.stdout)["batch_state"] == "rejected"  # the report stays data on stdout for scripts
    newest = max(version for aggregate, version in before if aggregate == batch_id)
    added = StoreRows(store_url_of(repo)).query("SELECT originator_id, originator_version, topic FROM {events} "
                                                 "WHERE originator_version > ? OR originator_id <> ?", newest, batch_id)
    assert sorted((aggregate, version, topic.rsplit(":", 1)[-1]) for aggregate, version, topic in added
                  if (aggregate, version) not in before) == [
        (batch_id, newest + 1, "TickRejected"), (batch_id, newest + 2, "TickRejected")]  # its audit event, each
