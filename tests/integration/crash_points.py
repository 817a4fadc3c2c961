"""Convergence after a crash at any point (issue 3).

A batch of four tasks (p1 and p2 in parallel, dep blocked by p1, zbad whose integration
rerun fails) runs once uninterrupted. Then, for every k, it runs again with a crash
injected right after the k-th engine call took effect (a git spawn, a kernel call or a
store save), and ticks resume in a new engine instance until the batch settles. Every
run must end like the uninterrupted one: the same child states, the same batch-branch
content, exactly one commit per integrated child (on the batch branch and on its Lane
branch), a log whose digest chain holds and whose record passes the v2 validator at
every version, and a state file equal to its rebuild. Each run's batch runs in its coordinator
worktree (the default: docs/concepts/coordinator.md), and the user's checkout stays on main with
none of the batch's files.

One module per integration mode (test_crash_points_<mode>.py, made by `crash_point_tests`), so
that pytest-xdist's workers share the modes out; each runs on SQLite and on PostgreSQL.

Which k run (`crash_points`). A crash only matters through what it leaves on disk and in the
store, and a call that only reads (`git rev-parse`, `git status` with optional locks off, a
kernel projection: READ_ONLY) leaves exactly what the call before it in the same tick left. So
a crash after such a call is the crash after the previous one, and is not run again; the first
call of each tick always runs (what lies before it is the harness's Steward and Executor, not
the engine), and so does the last. That leaves about 70 of the 175 calls of a speculative run.
On SQLite every third such k runs for the default mode and every sixth for the others (each
mode at its own offset; always each tick's first call and the last). On PostgreSQL the backend changes only the store,
so there only the k right after a store save count (a crash between an append and whatever
follows it, about 26 calls), sampled the same way; the git and kernel crash windows between two
saves are the same code on either backend and run on SQLite. (A PostgreSQL run costs about
twice a SQLite one on two cores; the samples keep CI inside its 15 minutes on this machine.)
"""

from __future__ import annotations

import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple

import pytest

from lanes_es.adapters import git as git_runner
from lanes_es.adapters.kernel import ReferenceKernel
from lanes_es.audit.chain import verify_chain
from lanes_es.domain.record import fold_record
from lanes_es.domain.validator import validate_record
from lanes_es.ports import KernelError
from lanes_es.tick_input import LaneOfferInput
from lanes_es.projections.batch import documents_of, drift
from tests.conftest import STORE_BACKENDS, backend_store
from tests.engine import SLUG, SteppingClock, Task, initiative_markdown
from tests.gitfixtures import descriptor, git_out, intent_json, make_repo, run_git, write_file
from lanes_es.usecases.authorize import authorize
from lanes_es.usecases.confirmation import BatchOptions, prepare_confirmation
from lanes_es.usecases.load import initiative
from lanes_es.usecases.coordinator import batch_root
from lanes_es.usecases.tick import tick

# Descriptors run coreutils' `test`, not python3: the run is repeated once per call, so each spawn counts.
PASSES = descriptor(["-n", "ok"], executable="test")
TASKS = {
    "p1": Task(["p1.txt"], verification=PASSES),
    "p2": Task(["p2.txt"], verification=PASSES),
    "dep": Task(["dep.txt"], blocked_by=["p1"], verification=PASSES),
    # Passes in its Lane, fails on its candidate, whatever the Lane's base: its Executor rewrites its own
    # acceptance (in its scope), which the Lane's QA does not run (QA runs the intent it enrolled with) and the
    # candidate's rerun does (it reads the intents the candidate holds).
    "zbad": Task(["zbad.txt", "docs/plans/zbad.intent.json"], verification=PASSES),
}
REWRITTEN = json.dumps(intent_json("zbad", TASKS["zbad"].scope, verification=descriptor(
    ["-e", "no-such-file"], executable="test")), indent=2) + "\n"
DELIVERIES = {task_id: [(task.scope[0], f"{task_id}\n")] for task_id, task in TASKS.items()}
DELIVERIES["zbad"].append(("docs/plans/zbad.intent.json", REWRITTEN))
MAX_TICKS = 30
# A sample of the distinct crash points per mode (crash_points), to keep CI inside its time.
DEFAULT_MODE = "speculative"
SAMPLE = 6
DEFAULT_SAMPLE = 3
MODES = ("serial", "speculative", "batched")
# Calls that change nothing a restarted engine reads (see the module docstring); anything else counts as a write.
READ_ONLY = frozenset({"git rev-parse", "git status", "git ls-files", "git diff-tree", "git cat-file", "git log",
                       "git ls-tree", "git rev-list", "git merge-base", "git for-each-ref", "git show", "git diff",
                       "kernel.project_task", "kernel.active_claim_task_id", "kernel.settled_evidence",
                       "kernel.read_tombstone", "kernel.current_intent", "kernel.status"})


class SimulatedCrash(BaseException):
    """Not an Exception: nothing in the engine may catch it, as nothing catches a power cut."""


class CrashPlan:
    """Counts engine calls of every kind and crashes right after the k-th one."""

    def __init__(self, crash_at: int | None) -> None:
        self.crash_at = crash_at
        self.calls = 0
        self.armed = False
        self.fired = False
        self.kinds: list[str] = []  # what each call was, in order
        self.tick_starts: set[int] = set()  # the number the first call of each tick gets

    def arm(self) -> None:
        self.armed = True
        self.tick_starts.add(self.calls + 1)

    def called(self, what: str) -> None:
        if not self.armed:
            return
        self.calls += 1
        self.kinds.append(what)
        if self.crash_at is not None and self.calls == self.crash_at and not self.fired:
            self.fired = True
            raise SimulatedCrash(f"crash after call {self.calls}: {what}")


class CrashingKernel:
    """The real kernel, with the crash plan consulted after each call."""

    def __init__(self, kernel: Any, plan: CrashPlan) -> None:
        self._kernel = kernel
        self._plan = plan

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._kernel, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return target(*args, **kwargs)
            finally:
                self._plan.called(f"kernel.{name}")
        return call


def build_engine(root: str, store: str, plan: CrashPlan, clock: SteppingClock) -> Any:
    """A new engine instance, as a restarted process would make, with the crash plan wired in."""
    from lanes_es.bootstrap import bootstrap

    deps = bootstrap(root, store, clock=clock)
    real_ports = deps.adapters.tick_ports
    deps.adapters.tick_ports = lambda r, s: _with_kernel(real_ports(r, s), plan)  # type: ignore[method-assign]
    real_save = deps.store.save

    def save(*aggregates: Any) -> int:
        try:
            return real_save(*aggregates)
        finally:
            plan.called("store.save")
    deps.store.save = save  # type: ignore[method-assign]
    return deps


def _with_kernel(ports: Any, plan: CrashPlan) -> Any:
    from dataclasses import replace

    return replace(ports, kernel=CrashingKernel(ports.kernel, plan))


class Template(NamedTuple):
    """The authorized repository every run copies (no Lane, no tick yet) and its store: on SQLite the
    repository's own file (copied with it), on PostgreSQL a schema (cloned for each run)."""

    root: str
    store: str | None  # None: the repository's own SQLite file
    mode: str


def make_template(base: Path, mode: str, store: str | None) -> Template:
    intents = {t: intent_json(t, task.scope, verification=task.verification) for t, task in TASKS.items()}
    root = make_repo(base / "repo", intents=intents, files={f"docs/initiatives/{SLUG}.md": initiative_markdown(TASKS)})
    return Template(root, store, mode)


def confirm(root: str, store: str | None, mode: str, clock: SteppingClock | None = None) -> None:
    """Confirmed in the copy, as a user would: the batch runs in a coordinator worktree of the copy's own
    (docs/concepts/coordinator.md), which every tick then finds from the log."""
    from lanes_es.bootstrap import bootstrap
    from lanes_es.usecases.coordinator import default_place, for_new_batch

    deps = bootstrap(root, store, clock=clock or SteppingClock())
    deps = for_new_batch(deps, SLUG, str(default_place(deps, SLUG)))
    authorize(deps, prepare_confirmation(deps, SLUG, BatchOptions(max_parallel=3, integration=mode, verify_workers=2)))
    deps.store.close()


@contextmanager
def copy_repository(template: Template, target: Path) -> Iterator[tuple[str, str | None]]:
    """A copy of the template's repository and store, for one run; the copied store is dropped after."""
    from tests.store_rows import clone_postgres_schema, remove_store

    shutil.copytree(template.root, target / "repo", symlinks=True)
    store = clone_postgres_schema(template.store) if template.store else None
    # The template is not confirmed: a coordinator worktree is a worktree of one repository, which a copy is not.
    confirm(os.path.realpath(target / "repo"), store, template.mode)
    try:
        yield os.path.realpath(target / "repo"), store
    finally:
        if store:
            remove_store(store)


def act_on_handoffs(root: str, lanes: Path, report: dict[str, Any], clock: SteppingClock) -> dict[str, str]:
    """Steward and Executor, idempotent so that a repeated handoff after a crash is harmless."""
    offers: dict[str, str] = {}
    for handoff in report["handoffs"]:
        task_id = handoff["task_id"]
        lane = lanes / task_id
        if handoff.get("action") == "provision":
            if not lane.exists():
                lanes.mkdir(parents=True, exist_ok=True)
                exists = run_git(root, "rev-parse", "--verify", "-q", handoff["lane_branch"], check=False).returncode == 0
                args = [str(lane), handoff["lane_branch"]] if exists else ["-b", handoff["lane_branch"], str(lane),
                                                                            handoff["base_head"]]
                run_git(root, "worktree", "add", "-q", *args)
            elif git_out(lane, "rev-parse", "HEAD") != handoff["base_head"]:
                # An unused Lane cut before the batch head moved: the steward re-cuts it at the new head.
                run_git(lane, "reset", "-q", "--hard", handoff["base_head"])
            offers[task_id] = os.path.realpath(lane)
        elif handoff.get("action") == "release":
            if lane.exists():
                run_git(root, "worktree", "remove", str(lane))
        elif handoff["role"] == "executor":
            for path, content in DELIVERIES[task_id]:
                write_file(lane, path, content)
            try:
                ReferenceKernel(clock=clock).submit(os.path.realpath(lane), task_id)
            except KernelError as error:
                assert "already submitted" in str(error)
    return offers


def git_call_name(args: tuple[str, ...]) -> str:
    """`git <subcommand>`, past global options such as --literal-pathspecs."""
    subcommand = next((arg for arg in args if not arg.startswith("-")), "")
    return f"git {subcommand}"


def run_batch(root: str, store: str | None, lanes: Path, crash_at: int | None) -> tuple[CrashPlan, dict[str, Any]]:
    """Tick until the batch settles; after a crash, go on with a new engine instance."""
    plan = CrashPlan(crash_at)
    clock = SteppingClock()
    offers: dict[str, str] = {}
    report: dict[str, Any] = {"batch_state": "running"}
    observer: Callable[[tuple[str, ...]], None] = lambda args: plan.called(git_call_name(args))
    git_runner.SPAWN_OBSERVERS.append(observer)
    try:
        for _ in range(MAX_TICKS):
            deps = build_engine(root, store, plan, clock)
            plan.arm()
            try:
                report = tick(deps, SLUG, offers=[LaneOfferInput(task_id=t, path=p) for t, p in offers.items()]).report
            except SimulatedCrash:
                offers = {}
                continue
            finally:
                plan.armed = False
                deps.store.close()
            if report["batch_state"] not in ("running", "rejected"):
                return plan, report
            offers = act_on_handoffs(root, lanes, report, clock)
    finally:
        git_runner.SPAWN_OBSERVERS.remove(observer)
    raise AssertionError(f"the batch did not settle in {MAX_TICKS} ticks (crash at {crash_at})")


def outcome(root: str, report: dict[str, Any]) -> dict[str, Any]:
    """What must be the same after every run: states, branch content outside the audit dirs, commit counts."""
    base = report_base(root)
    files = git_out(root, "ls-tree", "-r", f"imm/{SLUG}").splitlines()
    content = sorted(line for line in files if "\t.imm/" not in line)
    audit_runs = {}
    for line in files:
        path = line.split("\t", 1)[1]
        if path.startswith(".imm/audit/"):
            task, run = path.split("/")[2:4]
            audit_runs.setdefault(task, set()).add(run)
    integrated = [c["task_id"] for c in report["children"] if c["state"] in ("integrated", "released")]
    subjects = git_out(root, "log", "--format=%s", f"{base}..imm/{SLUG}").splitlines()
    lanes = {c["task_id"]: c["lane"] for c in report["children"] if c["task_id"] in integrated}
    lane_commits = {task: git_out(root, "rev-list", "--count", f"{lane['base_head']}..{lane['branch']}")
                    for task, lane in lanes.items()}
    return {
        "batch_state": report["batch_state"],
        # released is integrated plus the steward's removal of the Lane, whose timing follows the handoffs
        # a run happened to see; on the batch branch both are the same fact.
        "states": [(c["task_id"], "integrated" if c["state"] == "released" else c["state"]) for c in report["children"]],
        "reasons": [(c["task_id"], (c["reason"] or "").split(":")[0]) for c in report["children"]],
        "content": content,
        "subjects": sorted(subjects),
        "audit_runs_per_task": sorted((task, len(runs)) for task, runs in audit_runs.items()),
        "lane_commits": lane_commits,
        "commits_recorded": len(report["commits"]),
    }


def report_base(root: str) -> str:
    return git_out(root, "rev-parse", "main")


def check_log(root: str, store: str | None) -> None:
    """The chain holds, every prefix of the log folds to a valid record, the files equal the rebuild,
    and the signed checkpoint on the batch's ref covers the whole log with an attestation per integration."""
    from lanes_es.bootstrap import bootstrap

    deps = bootstrap(root, store)
    try:
        batch_id = initiative(deps, SLUG).current.batch_id
        events = deps.store.events(batch_id)
        assert verify_chain(events) == []
        for version in range(1, len(events) + 1):
            record = fold_record(events[:version])
            validate_record(record, batch_id)
        assert Path(root, ".imm").exists() is False, "the user's checkout holds the batch's files"
        assert git_out(root, "branch", "--show-current") == "main", "the user's checkout was switched"
        assert drift(batch_root(deps.store, root, batch_id), documents_of(deps.store.batch(batch_id))) == []
        check_anchor_holds(root, batch_id, deps.store.stored_events(batch_id), events)
    finally:
        deps.store.close()


def check_anchor_holds(root: str, batch_id: str, rows: list[Any], events: list[Any]) -> None:
    from lanes_es.adapters.anchor_git import branch_history, checkpoint_history, read_anchor
    from lanes_es.adapters.signing_key import local_verifier
    from lanes_es.audit.anchored import AnchorEvidence, check_anchor
    from lanes_es.bootstrap import locate_repository

    note, attestations = read_anchor(root, batch_id)
    assert note is not None, "no checkpoint was written"
    history, _ = branch_history(root, events[0].branch, events[0].base_head)
    evidence = AnchorEvidence(source="ref", note=note, verifier=local_verifier(locate_repository(root).common_dir),
                              attestations=attestations, branch_history=history,
                              history=checkpoint_history(root, batch_id))  # every checkpoint, each consistent
    checked = check_anchor(batch_id, rows, events, evidence)
    assert (checked.findings, checked.notes) == ([], []), (checked.findings, checked.notes)
    assert len(attestations) == len([e for e in events if type(e).__name__ == "Integrated"])


class Reference(NamedTuple):
    """The uninterrupted run: how many engine calls it made, what each was, where each tick began, how it ended."""

    calls: int
    kinds: list[str]
    tick_starts: set[int]
    expected: dict[str, Any]


def run_reference(template: Template, work: Path) -> Reference:
    """The uninterrupted run, checked against the design."""
    with copy_repository(template, work) as (root, store):
        plan, report = run_batch(root, store, work / "lanes", None)
        check_log(root, store)
        expected = outcome(root, report)
    assert expected["batch_state"] == "needs_human"
    assert dict(expected["states"]) == {"p1": "integrated", "p2": "integrated", "dep": "integrated",
                                        "zbad": "needs_human"}
    assert dict(expected["reasons"])["zbad"] == "batch_integration_check_failed"
    return Reference(plan.calls, plan.kinds, plan.tick_starts, expected)


def crash_points(mode: str, backend: str, reference: Reference) -> list[int]:
    """Which k run for this mode and backend (the module docstring says why)."""
    kinds, last = reference.kinds, reference.calls
    if backend == "postgresql":
        distinct = [k for k, what in enumerate(kinds, start=1) if what == "store.save"]
    else:
        distinct = [k for k, what in enumerate(kinds, start=1)
                    if what not in READ_ONLY or k in reference.tick_starts or k == last]
    # A sample, each mode its own offset: the modes share every step but integration, so together they
    # cover the windows of those steps; the default mode, whose integration rounds are the most involved,
    # runs every DEFAULT_SAMPLE-th point, the others every SAMPLE-th; on SQLite each tick's first call always.
    step = DEFAULT_SAMPLE if mode == DEFAULT_MODE else SAMPLE
    offset = sorted(MODES).index(mode) % step
    starts = set(reference.tick_starts) if backend != "postgresql" else set()
    return sorted(set(distinct[offset::step]) | starts | {last})


def check_crash(template: Template, crash_at: int, work: str, expected: dict[str, Any]) -> str | None:
    """One run with a crash after call `crash_at`; None when it converged, else what differed."""
    try:
        with copy_repository(template, Path(work)) as (root, store):
            plan, report = run_batch(root, store, Path(work) / "lanes", crash_at)
            # The last few calls may not recur: a probe of git's merge-tree options runs once per process.
            assert plan.fired or plan.calls < crash_at, "the crash never happened"
            got = outcome(root, report)
            assert got == expected, {key: (got[key], expected[key]) for key in got if got[key] != expected[key]}
            check_log(root, store)
        return None
    except AssertionError as error:
        return f"crash at call {crash_at}: {error}"
    finally:
        shutil.rmtree(work, ignore_errors=True)


def check_crashes(template: Template, crash_points: list[int], work: str, expected: dict[str, Any]) -> list[str]:
    return [failure for k in crash_points
            if (failure := check_crash(template, k, os.path.join(work, f"k{k}"), expected)) is not None]


def crash_point_tests(mode: str) -> tuple[Any, Any, Any, Any]:
    """The fixtures and tests of one mode's module: `template, reference, test_..., test_... = crash_point_tests(MODE)`."""

    @pytest.fixture(scope="module", params=STORE_BACKENDS)
    def template(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Template]:
        base = tmp_path_factory.mktemp(f"template-{mode}")
        if request.param == "sqlite":
            yield make_template(base, mode, None)
            return
        with backend_store(request.param, tmp_path_factory) as url:
            yield make_template(base, mode, url)

    @pytest.fixture(scope="module")
    def reference(template: Template, tmp_path_factory: pytest.TempPathFactory) -> Reference:
        return run_reference(template, tmp_path_factory.mktemp("uninterrupted"))

    def test_the_uninterrupted_run_settles_as_designed(reference):
        calls, kinds, expected = reference.calls, reference.kinds, reference.expected
        assert calls > 20 and len(kinds) == calls and "store.save" in kinds
        assert min(reference.tick_starts) == 1 and len(reference.tick_starts) > 3
        assert expected["subjects"] == ["imm(dep): Deliver dep", "imm(p1): Deliver p1", "imm(p2): Deliver p2"]
        assert expected["lane_commits"] == {"p1": "1", "p2": "1", "dep": "1"}

    def test_a_crash_at_any_call_converges_to_the_same_end(template, reference, tmp_path, request):
        """Every k of `crash_points`; failures are listed together.

        The runs go to two fresh worker processes (the machine has two cores): each git spawn
        forks the interpreter, which costs far less in a small worker than in pytest's process.
        """
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        expected = reference.expected
        points = crash_points(mode, request.node.callspec.params["template"], reference)
        chunks = [points[index::2] for index in range(2)]
        with ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("spawn")) as pool:
            results = pool.map(check_crashes, [template] * 2, chunks, [str(tmp_path)] * 2, [expected] * 2)
            failures = sorted((failure for chunk in results for failure in chunk),
                              key=lambda text: int(text.split()[3].rstrip(":")))
        assert failures == [], "\n".join(failures)

    return template, reference, test_the_uninterrupted_run_settles_as_designed, \
        test_a_crash_at_any_call_converges_to_the_same_end
