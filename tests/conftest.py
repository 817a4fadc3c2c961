"""Fixtures for the whole suite: the event store a test runs on, on both backends."""

from __future__ import annotations

import os
import sys
import uuid
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Callable, Iterator

import pytest
from hypothesis import HealthCheck, settings

# Property tests judge what code does, never how fast: hypothesis's default 200 ms deadline per example
# and its too_slow health check are timing assertions, and on a loaded 2-core machine they failed
# examples that were correct (test_plan, test_authoring).
settings.register_profile("lanes-es", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("lanes-es")

# The machine's PostgreSQL (user postgres, trust auth); .ci/run starts it when it is stopped.
POSTGRES_SERVER = os.environ.get("LANES_ES_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
STORE_BACKENDS = ("sqlite", "postgresql")

# The tests' Lanes and checks run `python3` (and `#!/usr/bin/env python3` scripts) from PATH. Where
# PATH starts with a version manager's shims (pyenv on these machines), every such call first runs
# about 30 shell processes (~0.13 s of CPU; thousands of calls in a run). The suite puts its own
# interpreter's directory first, as an activated virtualenv does, so those commands run it directly.
os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])


@pytest.fixture(autouse=True)
def coordinator_in_place(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The suite's tests of upstream's scenarios are about the coordinator checkout itself (a dirty coordinator,
    its branch moved, leaks restored in it): they run batches in place, as upstream (LANES_ES_COORDINATOR=.,
    inherited by the `lanes-es` processes they start). A test or module marked `coordinator_worktree` runs the
    default: each new batch in a coordinator worktree of its own (docs/concepts/coordinator.md)."""
    if request.node.get_closest_marker("coordinator_worktree") is None:
        monkeypatch.setenv("LANES_ES_COORDINATOR", ".")
    else:
        monkeypatch.delenv("LANES_ES_COORDINATOR", raising=False)


@pytest.fixture(params=STORE_BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
              monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The event store URL this test runs on: the test runs once on SQLite, once on PostgreSQL.

    - sqlite: a fresh file of its own (the embedded default's durability settings);
    - postgresql: a fresh schema of its own in the `test` database of the machine's server,
      dropped with everything in it after the test (tests run in parallel workers and share
      the server, so nothing is shared between tests).

    It also sets `LANES_ES_STORE` to that URL, so everything the test starts finds the store
    without passing it: `bootstrap`/`Engine.create`, `lanes_es.cli.main.main`, the MCP server and
    `lanes-es` subprocesses. Use it by asking for it, or for a whole module that goes through
    the service: `pytestmark = pytest.mark.usefixtures("store_url")`. Test ids gain
    `[sqlite]` / `[postgresql]`; `-k sqlite` runs one backend only.
    """
    with backend_store(request.param, tmp_path_factory) as url:
        monkeypatch.setenv("LANES_ES_STORE", url)
        yield url


@pytest.fixture
def another_store(store_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[], str]]:
    """Makes more stores on this test's backend (each fresh, dropped after), for a test that runs
    several coordinators side by side that must not share a log."""
    with ExitStack() as stack:
        backend = "postgresql" if store_url.startswith("postgresql") else "sqlite"
        yield lambda: stack.enter_context(backend_store(backend, tmp_path_factory))


@contextmanager
def backend_store(backend: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A fresh store on `backend` ("sqlite": a file; "postgresql": a schema, dropped after): what
    `store_url` gives a test, for module- and session-scoped fixtures that build a store once
    (parametrize them with `params=STORE_BACKENDS` and set LANES_ES_STORE around what they run)."""
    if backend == "sqlite":
        yield str(Path(tmp_path_factory.mktemp("store")) / "events.sqlite")
        return
    schema = f"t_{uuid.uuid4().hex[:16]}"
    postgres_statement(f"CREATE SCHEMA {schema}")
    try:
        yield f"{POSTGRES_SERVER}?schema={schema}"
    finally:
        postgres_statement(f"DROP SCHEMA {schema} CASCADE")


def postgres_statement(statement: str) -> None:
    """Run one statement on the test server (autocommit), failing the test with how to start it."""
    import psycopg

    from lanes_es.adapters.store import store_env

    env = store_env(POSTGRES_SERVER)
    try:
        with psycopg.connect(host=env["POSTGRES_HOST"], port=env["POSTGRES_PORT"], user=env["POSTGRES_USER"],
                             dbname=env["POSTGRES_DBNAME"], autocommit=True, connect_timeout=10) as connection:
            connection.execute(statement)
    except psycopg.OperationalError as error:
        pytest.fail(f"the PostgreSQL store tests need the server at {POSTGRES_SERVER} ({error}); "
                    f"start it (bash .ci/run does) or set LANES_ES_TEST_POSTGRES")


# The order whole modules go to `.ci/run`'s xdist workers (--dist loadfile; xdist's own reorder, which
# puts the modules with the most tests first, is switched off in pytest_configure):
# - the longest first (measured with --durations, both backends), so that no long module runs alone at
#   the end while the other core idles;
# - the modules that drive the MCP server through the SDK client near the end: the SDK stays in the
#   worker's memory once imported (+28 MB), and every git spawn the engine makes in a worker forks the
#   whole worker through `sh`, at a cost that grows with its size;
# - the unit tests last (fast, no git): they fill the workers' tails.
LONGEST_FIRST = ("integration/test_user_errors.py", "integration/test_world_moves.py", "integration/test_autopilot.py",
                 "integration/test_crash_points_speculative.py", "integration/test_crash_points_serial.py",
                 "integration/test_crash_points_batched.py", "integration/test_newcomer.py", "integration/test_engine.py",
                 "integration/test_steward_lease.py", "integration/test_observation.py",
                 "integration/test_user_permissions.py", "integration/test_integration_modes.py",
                 "integration/test_audit_must_show.py", "integration/test_anchored_audit.py",
                 "integration/test_bounded_inputs.py",
                 "integration/test_cli_properties.py", "integration/test_delegated_revision.py",
                 "integration/test_resume.py", "integration/test_audit_demo.py")
MCP_CLIENTS = ("integration/test_scenarios_rest.py", "integration/test_mcp_server.py", "integration/test_contention.py")


def module_rank(path: Path) -> tuple[int, int]:
    """Where a test module runs in the order above (ties keep the collection order)."""
    name = "/".join(path.parts[-2:])
    if name in LONGEST_FIRST:
        return 0, LONGEST_FIRST.index(name)
    if name in MCP_CLIENTS:
        return 2, MCP_CLIENTS.index(name)
    return (3, 0) if path.parent.name == "unit" else (1, 0)


def pytest_configure(config: pytest.Config) -> None:
    """Write the project's bytecode once, before any test starts (the controller only, not each xdist worker).

    The machines of this project set PYTHONDONTWRITEBYTECODE=1, so without this every `lanes-es`
    subprocess a test starts (and every Executor, MCP server and demo run) compiles every module it
    imports again: about 0.1 s of CPU of a tick's 0.25 s. Python still reads bytecode that exists, as an
    install has it; compileall only stats files whose bytecode is current, and __pycache__ is ignored by git."""
    if hasattr(config, "workerinput"):
        return
    if hasattr(config.option, "loadscopereorder"):  # xdist: keep module_rank's order (see LONGEST_FIRST)
        config.option.loadscopereorder = False
    import compileall

    project = Path(__file__).resolve().parents[1]
    for package in ("lanes_es", "tools", "tests"):  # lanes_es/projections links projections/
        compileall.compile_dir(str(project / package), quiet=2)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: module_rank(item.path))  # stable: each module keeps its order
