"""The runtime never manages worktrees or deletes work (LANE-STAT-01/02/03, LANE-ENR-04).

Upstream greps its lane modules for quoted tokens. Here the source is parsed with `ast`: every
call of the git runner (`git(root, *args)` / `git_ok(...)`) is read with its literal arguments,
module-level argument tuples expanded, so a test names the git subcommand each call runs. The
same reader, pointed at the steward (lanes_es/steward/lanes.py), finds its `worktree add` and
`worktree remove`: the control that shows the reader sees such calls when they are there.

The steward lives in the engine (lanes_es/steward/, docs/architecture.md) since the autopilot's logic left
tools/ (issue 10); the entry points now ship inside the package (lanes_es/cli/, lanes_es/mcp_server.py),
so "the runtime never runs `git worktree`" reads "nothing in lanes_es/ but
the steward package does", and the steward package must not reach into the tick's modules.

The dynamic half (LANE-ENR-04) runs two children to completion on real git and watches every
git spawn the engine makes, through the runner's SPAWN_OBSERVERS hook.
"""

from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

PROJECT = Path(__file__).resolve().parents[2]
# The lane driver and the integrator: upstream's batch_lanes.ts and batch_integration.ts.
LANE_MODULES = [*sorted(str(path.relative_to(PROJECT)) for folder in ("tick", "usecases")
                        for path in (PROJECT / "lanes_es" / folder).glob("*.py")),
                "lanes_es/adapters/lane_git.py", "lanes_es/adapters/candidate_git.py", "lanes_es/adapters/check_runner.py"]
# The entry points that stand where upstream's Host adapters stand.
ENTRY_POINTS = ["lanes_es/cli/main.py", "lanes_es/mcp_server.py", "lanes_es/cli/run.py"]
# The entry points' packages: they drive the steward and the use cases, as a Host does.
ENTRY_PACKAGES = ("lanes_es/cli/", "lanes_es/mcp_server.py")
# The only code allowed to make and remove Lanes (docs/architecture.md: "only the steward provisions and removes Lanes").
STEWARD = "lanes_es/steward"
STEWARD_LANES = "lanes_es/steward/lanes.py"
RUNNER_NAMES = {"git", "git_ok"}
SWITCHING = {"worktree", "checkout", "switch"}
DELETING_FLAGS = {"branch": {"-d", "-D", "-m", "-M", "--delete", "--move", "--force"},
                  "update-ref": {"-d", "--delete"}, "worktree": {"remove", "prune"}}
QUOTED_TOKENS = {"worktree", "checkout", "switch", "prune", "rm"}
DELETE_CALLS = {"rmtree", "remove", "unlink", "rmdir", "removedirs"}
OS_SPAWNS = re.compile(r"^(system|popen|spawn\w*|exec\w*|posix_spawn\w*)$")
# The Ray runner (lanes_es/adapters/ray_cluster.py) also reads Ray's own token settings, which is how
# Ray's documentation tells a client to authenticate, and quiets gRPC's informational lines.
ENV_ALLOWED = re.compile(r"^(GIT_[A-Z_]+|LANES_ES_[A-Z_]+|PATH|RAY_AUTH_[A-Z_]+|GRPC_VERBOSITY|GRPC_ENABLE_FORK_SUPPORT)$")


@dataclass(frozen=True)
class GitCall:
    line: int
    args: tuple[str | None, ...]  # None: an argument that is not a literal string

    @property
    def subcommand(self) -> str | None:
        """The first argument that is not a `-c key=value` pair or an option."""
        args = list(self.args)
        while args:
            first = args.pop(0)
            if first == "-c":
                args = args[1:]
            elif first is None or not first.startswith("-"):
                return first
        return None


def parse(relative: str) -> ast.Module:
    return ast.parse((PROJECT / relative).read_text(encoding="utf-8"), filename=relative)


def module_tuples(tree: ast.Module) -> dict[str, tuple[str | None, ...]]:
    """Module-level `NAME = ("...", ...)` constants, the argument lists a git call may splat."""
    found: dict[str, tuple[str | None, ...]] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, (ast.Tuple, ast.List)):
            values = tuple(item.value if isinstance(item, ast.Constant) and isinstance(item.value, str) else None
                           for item in node.value.elts)
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found[target.id] = values
    return found


def callee(node: ast.Call) -> str | None:
    if isinstance(node.func, ast.Name):
        return node.func.id
    if isinstance(node.func, ast.Attribute):
        return node.func.attr
    return None


def git_calls(relative: str) -> list[GitCall]:
    tree = parse(relative)
    tuples = module_tuples(tree)
    calls: list[GitCall] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or callee(node) not in RUNNER_NAMES or not node.args:
            continue
        args: list[str | None] = []
        for argument in node.args[1:]:  # the first is the repository root
            if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
                args.append(argument.value)
            elif isinstance(argument, ast.Starred) and isinstance(argument.value, ast.Name) \
                    and argument.value.id in tuples:
                args.extend(tuples[argument.value.id])
            else:
                args.append(None)
        calls.append(GitCall(node.lineno, tuple(args)))
    return calls


def string_constants(relative: str) -> Iterator[tuple[int, str]]:
    for node in ast.walk(parse(relative)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value


def python_modules(*directories: str) -> list[str]:
    # lanes_es/projections is a link to the top-level projections/ (what ships); each file is read once
    return sorted({str(path.relative_to(PROJECT)) for directory in directories
                   for path in (PROJECT / directory).rglob("*.py")
                   if not path.relative_to(PROJECT).parts[:2] == ("lanes_es", "projections")})


# ---------------------------------------------------------------- the reader itself


def test_the_reader_sees_the_stewards_worktree_calls():
    """The control: the steward does run `worktree add` and `worktree remove`, and the reader finds them."""
    calls = {(call.subcommand, call.args[1]) for call in git_calls(STEWARD_LANES) if call.subcommand == "worktree"}
    assert {("worktree", "add"), ("worktree", "remove")} <= calls


def test_the_lane_modules_call_the_git_runner():
    """Were the runner renamed, the guards below would pass vacuously; they must see the calls."""
    assert len(git_calls("lanes_es/adapters/lane_git.py")) >= 4
    assert len(git_calls("lanes_es/adapters/candidate_git.py")) >= 8
    assert {call.subcommand for call in git_calls("lanes_es/adapters/candidate_git.py")} >= {"merge", "merge-tree",
                                                                                              "commit-tree"}


# ---------------------------------------------------------------- LANE-STAT-01


@pytest.mark.parametrize("module", LANE_MODULES)
def test_stat01_the_lane_modules_never_switch_or_manage_worktrees(module):
    for call in git_calls(module):
        assert call.subcommand is not None, f"{module}:{call.line} runs git with a subcommand that is not a literal"
        assert call.subcommand not in SWITCHING, f"{module}:{call.line} runs git {call.subcommand}"
    quoted = [(line, value) for line, value in string_constants(module) if value in QUOTED_TOKENS]
    assert quoted == [], f"{module} quotes {quoted}"


def test_stat01_only_the_steward_runs_worktree_commands():
    """Nothing in the runtime (lanes_es/ outside the steward, projections/) runs `git worktree`.

    The steward lives in lanes_es/steward/, so the one place allowed in lanes_es/ for Lanes is the
    steward's Lane module; the `run` entry point (lanes_es/cli/run.py) keeps no git call at all. The
    other is no Lane: a batch's coordinator worktree (lanes_es/adapters/coordinator_git.py), made when
    a batch is confirmed and removed after it ended, never by a tick's steps. tools/ may still make
    worktrees for the benchmarks, as a person playing the steward would.
    """
    worktree_calls = {module for module in python_modules("lanes_es", "projections")
                      for call in git_calls(module) if call.subcommand == "worktree"}
    assert worktree_calls == {STEWARD_LANES, "lanes_es/adapters/coordinator_git.py"}
    assert git_calls("lanes_es/cli/run.py") == []


def test_stat01_the_tick_does_not_import_the_steward():
    """The arrows point one way (docs/architecture.md): the steward drives the use cases; the runtime never calls the steward."""
    importers = [module for module in python_modules("lanes_es", "projections")
                 if not module.startswith(STEWARD) and not module.startswith(ENTRY_PACKAGES)
                 for node in ast.walk(parse(module)) if isinstance(node, ast.ImportFrom)
                 and (node.module or "").startswith("lanes_es.steward")]
    assert importers == []


# ---------------------------------------------------------------- LANE-STAT-02


@pytest.mark.parametrize("module", LANE_MODULES)
def test_stat02_the_lane_modules_never_delete_a_branch_or_a_worktree(module):
    for call in git_calls(module):
        flags = DELETING_FLAGS.get(call.subcommand or "", set())
        assert not flags.intersection(call.args), f"{module}:{call.line} runs git {' '.join(map(str, call.args))}"
    tree = parse(module)
    deleting = [(node.lineno, callee(node)) for node in ast.walk(tree)
                if isinstance(node, ast.Call) and callee(node) in DELETE_CALLS]
    assert deleting == [], f"{module} deletes files: {deleting}"
    spawning = [(node.lineno, node.func.attr) for node in ast.walk(tree)
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "os" and OS_SPAWNS.match(node.func.attr)]
    assert spawning == [], f"{module} spawns outside the git runner: {spawning}"
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                for alias in node.names} | {node.module.split(".")[0] for node in ast.walk(tree)
                                            if isinstance(node, ast.ImportFrom) and node.module}
    assert not imported & {"shutil", "subprocess", "sh"}, f"{module} imports {imported & {'shutil', 'subprocess', 'sh'}}"


@pytest.mark.parametrize("module, temporaries", [("lanes_es/adapters/lane_git.py", 0),
                                                  ("lanes_es/adapters/candidate_git.py", 0),
                                                  ("lanes_es/adapters/check_runner.py", 1)])
def test_stat02_the_integrators_only_removal_is_its_own_temporary_directory(module, temporaries):
    """The candidate's descriptor rerun (the check runner) materializes a tree in a TemporaryDirectory; nothing
    else is removed, and the git side of the integrator makes no temporary at all."""
    tree = parse(module)
    temporary = [node for node in ast.walk(tree) if isinstance(node, ast.Call) and callee(node) == "TemporaryDirectory"]
    assert len(temporary) == temporaries
    made_dirs = [node for node in ast.walk(tree) if isinstance(node, ast.Call) and callee(node) in {"mkdtemp", "mkstemp"}]
    assert made_dirs == []  # a temporary the module would have to remove by hand


# ---------------------------------------------------------------- LANE-STAT-03


@pytest.mark.parametrize("module", python_modules("lanes_es", "projections"))
def test_stat03_no_workspace_tool_environment_variable_is_named(module):
    assert not re.search("herdr", (PROJECT / module).read_text(encoding="utf-8"), re.IGNORECASE)


def environment_reads(module: str) -> list[tuple[int, str | None]]:
    """Each `os.environ.get(K)`, `os.environ[K]`, `os.getenv(K)` and `K in os.environ`, with K when literal."""
    reads: list[tuple[int, str | None]] = []

    def key(node: ast.AST) -> str | None:
        return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None

    def is_environ(node: ast.AST) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "environ") or \
            (isinstance(node, ast.Name) and node.id == "environ")

    for node in ast.walk(parse(module)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            if node.func.attr in ("get", "pop", "setdefault") and is_environ(node.func.value):
                reads.append((node.lineno, key(node.args[0])))
            elif node.func.attr == "getenv":
                reads.append((node.lineno, key(node.args[0])))
        elif isinstance(node, ast.Subscript) and is_environ(node.value):
            reads.append((node.lineno, key(node.slice)))
        elif isinstance(node, ast.Compare) and any(is_environ(c) for c in node.comparators):
            reads.append((node.lineno, key(node.left)))
    return reads


def test_stat03_the_runtime_reads_only_its_own_git_and_lanes_es_variables():
    reads = [(module, line, name) for module in python_modules("lanes_es") for line, name in environment_reads(module)]
    assert reads, "the reader found no environment read at all; it would pass vacuously"
    strays = [(module, line, name) for module, line, name in reads if name is None or not ENV_ALLOWED.match(name)]
    assert strays == []


def test_stat03_the_reader_sees_every_form_of_environment_read(tmp_path):
    probe = tmp_path / "probe.py"  # an absolute path: PROJECT / it is itself
    probe.write_text("import os\nos.environ.get('HERDR_PANE')\nos.environ['A_B']\nos.getenv('C_D')\n"
                     "'E_F' in os.environ\nos.environ.get(name)\n", encoding="utf-8")
    assert [name for _, name in environment_reads(str(probe))] == ["HERDR_PANE", "A_B", "C_D", "E_F", None]


# ---------------------------------------------------------------- LANE-ENR-04, on real git


def worktrees(root: str) -> list[tuple[str, str | None]]:
    """(real path, branch) of every worktree `git worktree list --porcelain` shows."""
    from tests.gitfixtures import git_out

    found: list[tuple[str, str | None]] = []
    for block in git_out(root, "worktree", "list", "--porcelain").split("\n\n"):
        fields = dict(line.partition(" ")[::2] for line in block.splitlines() if line)
        found.append((os.path.realpath(fields["worktree"]), fields.get("branch")))
    return found


@pytest.mark.usefixtures("store_url")  # the whole engine, on each backend
def test_enr04_after_two_children_complete_only_the_tests_worktrees_exist(tmp_path, monkeypatch):
    from lanes_es.adapters import git as runner
    from tests.engine import Task
    from tests.engine_more import make_engine
    from tests.gitfixtures import current_branch

    spawned: list[tuple[str, ...]] = []
    monkeypatch.setattr(runner, "SPAWN_OBSERVERS", [spawned.append])
    engine = make_engine(tmp_path, {"task-a": Task(["a.txt"]), "task-b": Task(["b.txt"])})
    engine.authorize(max_parallel=2)
    report = engine.tick()
    first_tick = list(spawned)
    lanes = {task_id: engine.provision(task_id, report) for task_id in ("task-a", "task-b")}
    engine.tick(offers=lanes)
    engine.deliver("task-a", "a.txt", "a\n")
    engine.deliver("task-b", "b.txt", "b\n")
    report = engine.tick()
    assert report["batch_state"] == "completed"
    assert engine.states() == ["integrated", "integrated"]

    assert worktrees(engine.root) == [(engine.root, "refs/heads/imm/initiative-slug"),
                                      (lanes["task-a"], "refs/heads/imm-lane/initiative-slug/task-a"),
                                      (lanes["task-b"], "refs/heads/imm-lane/initiative-slug/task-b")]
    assert current_branch(engine.root) == "imm/initiative-slug"
    # the one branch switch is the fresh batch's preflight onto imm/<slug> (LANE-SER-01), at the first tick
    switches = [args for args in spawned if {"checkout", "switch", "worktree"} & set(args[:2])]
    assert [args[:4] for args in switches] == [("checkout", "-q", "-b", "imm/initiative-slug")]
    assert switches[0] in first_tick
    assert not [args for args in spawned if args[:1] == ("branch",) and DELETING_FLAGS["branch"] & set(args)]
