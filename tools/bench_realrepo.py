"""`lanes-es bench realrepo`: the autopilot against the naive serial merge queue, on a real project.

The project is boltons 26.2.0, its source distribution from the package index (downloaded once with
pip and cached under ~/.cache/lanes-es/bench, its sha256 checked): pure Python, its own pytest suite
one file per module, each file about 0.8 s here (pytest's start-up included), CPU-bound. K = 8 tasks,
each a small real change to one module with that module's own test file as its acceptance
(`python3 -m pytest -q -p no:cacheprovider tests/test_<module>.py`), the scope the module and its test
file. Two cases:

- `passing`: every change keeps every test passing;
- `conflict`: one behaviour conflict (the typeutils task changes how sentinels print, which breaks the
  test the cacheutils task, earlier in the plan, added) and one scope breach (the iterutils task also
  edits README.md, outside its scope).

Before the first measured run, every task's check runs once, untimed, on the base (in an environment
that never ran them, the first runs also compile pytest to bytecode, and whichever side went first would
pay it). Each run makes a fresh repository from the sdist and runs, interleaved (the order alternates from
one repeat to the next, so load drifts hit both alike):

- lanes-es: `lanes-es run` in this process (the autopilot, as the CLI calls it, its default poll),
  a scripted Executor that applies the task's change and submits; the Executors wait for each other
  before they exit, so one tick finds the 8 Lanes submitted (the merge-queue case);
- the naive serial queue a user would write instead, on a clone of the same base: for each task in
  plan order, apply its change, refuse it if it touched a file outside its scope, run its check and
  the check of every task landed before it (each its own process, as the descriptors are), and commit
  when all pass (else put the tree back).

Printed per case: both walls, their ratio (median over the pairs of one repeat), both CPU times (user and
system, of this process and every child it waited for: the checks, git, the Executors) and their ratio,
which a machine loaded by other sessions does not skew as it skews the walls, check runs, git
spawns (lanes-es: the engine's own in this process, the Executors' `task submit` not counted; naive:
its git commands), spawns per integrated Lane, which tasks integrated and parked (both sides must
agree), and the fixed cost: from the last Executor's submit to the first candidate check, next to
the Lanes' QA time. The load average is printed with each run: the machine is shared.
"""

from __future__ import annotations

import argparse
import hashlib
from collections import Counter
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

PROJECT, VERSION = "boltons", "26.2.0"
SDIST = f"{PROJECT}-{VERSION}.tar.gz"
SDIST_SHA256 = "d39cfd15c1a1c3bd4d705c82252fa9edb8e4f5e8cc039f8e39afac7b1b47e92c"
SLUG = "realrepo"
CASES = ("passing", "conflict")
PYTEST = ["python3", "-m", "pytest", "-q", "-p", "no:cacheprovider"]


def register(commands: Any) -> None:
    command = commands.add_parser("realrepo", help="the autopilot against a naive serial merge queue, on boltons",
                                  description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    command.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES), help="which cases (default both)")
    command.add_argument("--repeat", type=int, default=3, help="runs of each case, interleaved (default 3)")
    command.add_argument("--modes", nargs="+", default=[None],
                         help="integration modes of the lanes-es runs (default: the default mode)")
    command.add_argument("--verify-workers", type=int, default=None, help="candidate checks at once (default: K)")
    command.add_argument("--poll", type=float, default=1.0, help="the autopilot's poll, seconds (default: run's, 1)")
    command.add_argument("--cache", default=None, help="where the sdist is kept (default ~/.cache/lanes-es/bench)")
    command.add_argument("--keep", default=None, metavar="DIR", help="work in DIR and keep it (default: a temp dir)")
    command.add_argument("--timeline", action="store_true",
                         help="print where each lanes-es run's time went (its steps, from its start)")
    command.add_argument("--json", action="store_true", help="one JSON object per run, then the summary")
    command.set_defaults(func=lambda args: run_realrepo_bench(args))


# ---------------------------------------------------------------- the tasks


@dataclass(frozen=True)
class Task:
    task_id: str
    module: str  # boltons/<module>.py and tests/test_<module>.py
    code: str  # appended to the module
    test: str  # appended to its test file
    edits: tuple[tuple[str, str, str], ...] = ()  # (path, old, new) replacements, after the appends

    @property
    def scope(self) -> list[str]:
        return [f"boltons/{self.module}.py", f"tests/test_{self.module}.py"]

    @property
    def check(self) -> list[str]:
        return [*PYTEST, f"tests/test_{self.module}.py"]


def tasks(case: str) -> list[Task]:
    """The 8 tasks in plan order; `conflict` changes the typeutils task and makes the iterutils one breach."""
    typeutils = TYPEUTILS_BREAKING if case == "conflict" else TYPEUTILS
    iterutils = ITERUTILS_BREACHING if case == "conflict" else ITERUTILS
    return [STRUTILS, CACHEUTILS, DICTUTILS, iterutils, MATHUTILS, typeutils, TIMEUTILS, URLUTILS]


STRUTILS = Task("rr1-strutils", "strutils", '''

def removesuffix(text: str, suffix: str) -> str:
    """Remove `suffix` from the end of `text` if present (str.removesuffix, for older Pythons)."""
    if suffix and text.endswith(suffix):
        return text[:-len(suffix)]
    return text
''', '''

def test_removesuffix():
    assert strutils.removesuffix('file.tar.gz', '.gz') == 'file.tar'
    assert strutils.removesuffix('file.tar.gz', '.zip') == 'file.tar.gz'
    assert strutils.removesuffix('abc', '') == 'abc'
''')

CACHEUTILS = Task("rr2-cacheutils", "cacheutils", '''

def cache_stats(cache):
    """A cache's size and hit counts as a dict (LRI and LRU keep the counts)."""
    return {'size': len(cache), 'max_size': getattr(cache, 'max_size', None),
            'hits': getattr(cache, 'hit_count', 0), 'misses': getattr(cache, 'miss_count', 0)}
''', '''

def test_cache_stats_and_missing_repr():
    from boltons import cacheutils
    cache = LRU(max_size=2)
    cache['a'] = 1
    cache.get('a')
    cache.get('b')
    assert cacheutils.cache_stats(cache) == {'size': 1, 'max_size': 2, 'hits': 1, 'misses': 1}
    # help() shows the default of optional arguments by this repr
    assert repr(cacheutils._MISSING) == '_MISSING'
''')

DICTUTILS = Task("rr3-dictutils", "dictutils", '''

def invert(d):
    """A new dict mapping each value of `d` to its key; ValueError when two keys share a value."""
    inverted = {}
    for key, value in d.items():
        if value in inverted:
            raise ValueError(f'value {value!r} is held by {inverted[value]!r} and {key!r}')
        inverted[value] = key
    return inverted
''', '''

def test_invert():
    from boltons.dictutils import invert
    assert invert({'a': 1, 'b': 2}) == {1: 'a', 2: 'b'}
    with pytest.raises(ValueError):
        invert({'a': 1, 'b': 1})
''')

ITERUTILS = Task("rr4-iterutils", "iterutils", '''

def last(iterable, default=None, key=None):
    """The last element of `iterable` for which `key` is true (or that is truthy), else `default`."""
    found = default
    for item in iterable:
        if (key(item) if key is not None else item):
            found = item
    return found
''', '''

def test_last():
    from boltons.iterutils import last
    assert last([0, 1, 2, 0]) == 2
    assert last([], default='x') == 'x'
    assert last(range(10), key=lambda n: n % 3 == 0) == 9
''')

ITERUTILS_BREACHING = Task(ITERUTILS.task_id, ITERUTILS.module, ITERUTILS.code, ITERUTILS.test,
                           edits=(("README.md", "", "\n`iterutils.last` is new.\n"),))

MATHUTILS = Task("rr5-mathutils", "mathutils", '''

def lerp(start, stop, fraction):
    """The value `fraction` of the way from `start` to `stop`."""
    return start + (stop - start) * fraction
''', '''

def test_lerp():
    from boltons.mathutils import lerp
    assert lerp(0, 10, 0.25) == 2.5
    assert lerp(10, 0, 1) == 0
''')

TYPEUTILS = Task("rr6-typeutils", "typeutils", '''

def is_sentinel(obj):
    """Whether `obj` was made by make_sentinel."""
    return type(obj).__name__ == 'Sentinel' and hasattr(obj, 'var_name')
''', '''

def test_is_sentinel():
    from boltons.typeutils import is_sentinel
    assert is_sentinel(NOT_SET)
    assert not is_sentinel(None)
''')

TYPEUTILS_BREAKING = Task(TYPEUTILS.task_id, TYPEUTILS.module, TYPEUTILS.code, TYPEUTILS.test + '''

def test_sentinel_repr_is_marked():
    assert repr(NOT_SET) == '<NOT_SET>'
''', edits=(("boltons/typeutils.py", "            if self.var_name:\n                return self.var_name\n",
             "            if self.var_name:\n                return f'<{self.var_name}>'\n"),))

TIMEUTILS = Task("rr7-timeutils", "timeutils", '''

def round_timedelta(td, unit=timedelta(seconds=1)):
    """`td` rounded to the nearest multiple of `unit`."""
    return unit * round(td / unit)
''', '''

def test_round_timedelta():
    from datetime import timedelta
    from boltons.timeutils import round_timedelta
    assert round_timedelta(timedelta(seconds=1.6)) == timedelta(seconds=2)
    assert round_timedelta(timedelta(minutes=7), timedelta(minutes=5)) == timedelta(minutes=5)
''')

URLUTILS = Task("rr8-urlutils", "urlutils", '''

def strip_fragment(url_text):
    """The URL without its fragment (`#...`)."""
    url = URL(url_text)
    url.fragment = ''
    return url.to_text()
''', '''

def test_strip_fragment():
    from boltons.urlutils import strip_fragment
    assert strip_fragment('http://example.com/a?b=1#c') == 'http://example.com/a?b=1'
    assert strip_fragment('http://example.com/') == 'http://example.com/'
''')


def apply_change(tree: Path, task: Task) -> None:
    """The task's change, applied once (an Executor started again finds it there)."""
    appends = [(f"boltons/{task.module}.py", task.code), (f"tests/test_{task.module}.py", task.test)]
    for relative, text in appends:
        path = tree / relative
        held = path.read_text(encoding="utf-8")
        if text not in held:
            path.write_text(held + text, encoding="utf-8")
    for relative, old, new in task.edits:
        path = tree / relative
        held = path.read_text(encoding="utf-8")
        if new in held:
            continue
        if old and old not in held:
            raise RuntimeError(f"{task.task_id}: {relative} does not hold the text its change replaces")
        path.write_text(held.replace(old, new, 1) if old else held + new, encoding="utf-8")


# ---------------------------------------------------------------- the project


def cached_sdist(cache: Path) -> Path:
    """The sdist, downloaded once with pip into `cache`; its sha256 must be the pinned one."""
    target = cache / SDIST
    if not target.exists():
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                        f"{PROJECT}=={VERSION}", "-d", str(cache)], check=True)
    digest = hashlib.sha256(target.read_bytes()).hexdigest()
    if digest != SDIST_SHA256:
        raise RuntimeError(f"{target} has sha256 {digest}, not the pinned {SDIST_SHA256}: remove it and run again")
    return target


def unpack(sdist: Path, root: Path) -> None:
    """The sdist's files under `root` (its top directory dropped)."""
    with tarfile.open(sdist) as archive:
        for member in archive.getmembers():
            parts = member.name.split("/", 1)
            if len(parts) < 2 or not member.isfile():
                continue
            target = root / parts[1]
            target.parent.mkdir(parents=True, exist_ok=True)
            with archive.extractfile(member) as source:  # type: ignore[union-attr]
                target.write_bytes(source.read())


def intent(task: Task) -> str:
    return json.dumps({
        "contract": "assurance_kernel/task_intent/v1", "task_id": task.task_id,
        "goal": f"A small change to boltons.{task.module}, with its test",
        "acceptance": [{"id": "A1", "assertion": f"tests/test_{task.module}.py passes", "verification": json.dumps({
            "contract": "assurance_kernel/verification_descriptor/v2",
            "command": {"executable": task.check[0], "argv": task.check[1:], "cwd": ".", "timeout_ms": 300000,
                        "max_output_bytes": 262144},
            "environment": {"prepare": None, "writable_paths": []}})}],
        "scope_hint": task.scope, "risk": "routine", "revision": 1, "owner": "user"}, indent=2) + "\n"


def make_base(root: Path, sdist: Path, planned: list[Task]) -> None:
    from tools.bench import make_repository

    by_id = {task.task_id: task for task in planned}
    make_repository(root, {SLUG: list(by_id)}, lambda index, task_id: intent(by_id[task_id]),
                    populate=lambda tree: _populate(tree, sdist))


def _populate(tree: Path, sdist: Path) -> None:
    unpack(sdist, tree)
    (tree / ".gitignore").write_text(".imm/state/\n__pycache__/\n.pytest_cache/\n")


# ---------------------------------------------------------------- lanes-es


def executor_argv(case: str, barrier: Path, count: int) -> list[str]:
    """The scripted Executor (`execute` below): it applies the task's change in its Lane and submits."""
    return [sys.executable, "-P", "-m", "tools.bench_realrepo", case, str(barrier), str(count)]


def execute(case: str, barrier: Path, count: int) -> int:
    """In the Lane: apply the change, `lanes-es task submit`, note when, then wait for the other Executors."""
    task_id, lane = os.environ["LANES_ES_TASK_ID"], Path(os.environ["LANES_ES_LANE_PATH"])
    apply_change(lane, next(task for task in tasks(case) if task.task_id == task_id))
    code = subprocess.run([sys.executable, "-P", "-m", "lanes_es.cli.main", "--root", str(lane), "task", "submit"],
                          cwd=lane).returncode
    (barrier / task_id).write_text(repr(time.time()))
    while len(os.listdir(barrier)) < count:
        time.sleep(0.02)
    return code


@dataclass
class Timeline:
    """Wall-clock moments of one lanes-es run (time.time(), comparable with the Executors' own)."""

    first_integration_check: float | None = None


# The steps a timeline shows: (module, attribute, label); a method as "Class.method".
TRACED = (("lanes_es.steward.lanes", "Steward.provision", "provision a Lane"),
          ("lanes_es.steward.executors", "Executors.start", "start an Executor"),
          ("lanes_es.usecases.tick", "tick", "tick"),
          ("lanes_es.tick.qa", "advance_children", "QA of the Lanes"),
          ("lanes_es.tick.commit", "commit_settled", "lane commits"),
          ("lanes_es.tick.integrate", "integrate_committed", "integration"),
          ("lanes_es.adapters.candidate_git", "GitCandidates.build_chain", "build a chain of candidates"),
          ("lanes_es.adapters.qa", "run_command", "a check"))


@contextmanager
def traced(spans: list[tuple[str, float, float]]) -> Iterator[None]:
    """Record each call of the TRACED steps as (label, start, end) in wall-clock time."""
    import importlib
    import threading

    lock = threading.Lock()
    undo = []
    for module_name, attribute, label in TRACED:
        owner: Any = importlib.import_module(module_name)
        *path, name = attribute.split(".")
        for part in path:
            owner = getattr(owner, part)
        original = getattr(owner, name)

        def wrapper(*args: Any, __original: Any = original, __label: str = label, **kwargs: Any) -> Any:
            began = time.time()
            try:
                return __original(*args, **kwargs)
            finally:
                with lock:
                    spans.append((__label, began, time.time()))

        setattr(owner, name, wrapper)
        undo.append((owner, name, original))
    try:
        yield
    finally:
        for owner, name, original in reversed(undo):
            setattr(owner, name, original)


def tell_timeline(spans: list[tuple[str, float, float]], start: float, submits: list[float]) -> None:
    """Each step's first start and last end, from the run's start; checks apart for QA and for candidates."""
    last_submit = max(submits) if submits else None
    steps: dict[str, list[tuple[float, float]]] = {}
    qa = [span for span in spans if span[0] == "QA of the Lanes"]
    for label, began, ended in spans:
        if label == "a check":
            label = "checks in QA" if any(q[1] <= began <= q[2] for q in qa) else "candidate checks"
        steps.setdefault(label, []).append((began, ended))
    print(f"  timeline (s from the run's start; last Executor submit at "
          f"{'-' if last_submit is None else f'{last_submit - start:.2f}'}):")
    for label, found in sorted(steps.items(), key=lambda item: min(b for b, _ in item[1])):
        print(f"    {min(b for b, _ in found) - start:7.2f} .. {max(e for _, e in found) - start:7.2f}  {label} "
              f"(x{len(found)}, {sum(e - b for b, e in found):.2f} s summed)")


@contextmanager
def first_check_noted(probe: Any, timeline: Timeline) -> Iterator[None]:
    import lanes_es.adapters.qa as qa_adapter

    run_command = qa_adapter.run_command

    def noted(*args: Any, **kwargs: Any) -> Any:
        if probe.current is probe.integration and timeline.first_integration_check is None:
            timeline.first_integration_check = time.time()
        return run_command(*args, **kwargs)

    qa_adapter.run_command = noted
    try:
        yield
    finally:
        qa_adapter.run_command = run_command


def run_lanes(workdir: Path, sdist: Path, case: str, mode: str | None, verify_workers: int | None,
              poll: float, show_timeline: bool = False) -> dict[str, Any]:
    from lanes_es.adapters.git import STATS  # here, not at the top: each scripted Executor imports this module
    from lanes_es.bootstrap import bootstrap
    from lanes_es.steward.run import AutopilotOptions, run_autopilot
    from lanes_es.usecases.confirmation import BatchOptions
    from lanes_es.usecases.load import active_batch
    from tools.bench_integration import probing

    planned = tasks(case)
    repo, lanes, barrier = workdir / "repo", workdir / "lanes", workdir / "barrier"
    make_base(repo, sdist, planned)
    barrier.mkdir(parents=True)
    argv = executor_argv(case, barrier, len(planned))
    deps = bootstrap(repo)
    lines: list[str] = []
    timeline = Timeline()
    spawns = STATS.spawns
    options = AutopilotOptions(batch=BatchOptions(max_parallel=len(planned), integration=mode,
                                                  verify_workers=verify_workers),
                               lanes_dir=lanes, executor=argv, yes=True, poll=poll)
    spans: list[tuple[str, float, float]] = []
    STATS.keep_commands, kept = show_timeline, len(STATS.commands)
    with probing(deps) as probe, first_check_noted(probe, timeline), \
            (traced(spans) if show_timeline else nullcontext()):
        began, started, cpu = time.perf_counter(), time.time(), cpu_seconds()
        code = run_autopilot(deps, SLUG, options, out=lines.append)
        wall, cpu = time.perf_counter() - began, cpu_seconds() - cpu
    spawned = STATS.spawns - spawns
    batch = active_batch(deps, SLUG)
    record = batch.record if batch is not None else {"children": []}
    deps.store.close()
    if code not in (0, 3):
        raise RuntimeError(f"the autopilot stopped with exit {code}: " + " | ".join(lines[-5:]))
    integrated = [c["task_id"] for c in record["children"] if c["state"] in ("integrated", "released")]
    parked = [c["task_id"] for c in record["children"] if c["state"] == "needs_human"]
    submits = [float(path.read_text()) for path in barrier.iterdir()]
    if show_timeline:
        tell_timeline(spans, started, submits)
        commands = Counter(next((part for part in command.split(" ") if not part.startswith("-")), command)
                           for command in STATS.commands[kept:])
        print("  git spawns by command: " + ", ".join(f"{name} {count}" for name, count in commands.most_common()))
        STATS.keep_commands = False
    first = timeline.first_integration_check
    return {"wall": wall, "cpu": cpu, "checks": probe.qa.checks + probe.integration.checks, "qa_checks": probe.qa.checks,
            "integration_checks": probe.integration.checks, "git_spawns": spawned,
            "spawns_per_integrated": spawned / max(len(integrated), 1),
            "integrated": integrated, "parked": parked, "qa_seconds": probe.qa.seconds,
            "submit_to_first_check": (first - max(submits)) if first is not None and submits else None,
            "mode": mode or _default_mode()}


def _default_mode() -> str:
    from lanes_es.domain.candidates import DEFAULT_INTEGRATION

    return DEFAULT_INTEGRATION


# ---------------------------------------------------------------- the naive queue


def run_naive(workdir: Path, sdist: Path, case: str) -> dict[str, Any]:
    """The 20-line serial merge queue: apply, refuse a change outside its files, run the checks, commit."""
    planned = tasks(case)
    base, repo = workdir / "base", workdir / "queue"
    make_base(base, sdist, planned)
    counts = {"checks": 0, "git": 0}

    def git(*args: str) -> str:
        counts["git"] += 1
        return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout

    began, cpu = time.perf_counter(), cpu_seconds()
    counts["git"] += 1
    subprocess.run(["git", "clone", "-q", str(base), str(repo)], check=True)
    landed: list[Task] = []
    parked: list[str] = []
    for task in planned:
        apply_change(repo, task)
        touched = {line[3:] for line in git("status", "--porcelain", "--untracked-files=all").splitlines()}
        passed = touched <= set(task.scope)
        for check in ([task, *landed] if passed else []):
            counts["checks"] += 1
            if subprocess.run(check.check, cwd=repo, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode:
                passed = False
                break
        if passed:
            git("add", "-A")
            git("commit", "-q", "-m", f"{task.task_id}: {task.module}")
            landed.append(task)
        else:
            git("checkout", "-q", "--", ".")
            git("clean", "-q", "-fd")
            parked.append(task.task_id)
    wall, cpu = time.perf_counter() - began, cpu_seconds() - cpu
    return {"wall": wall, "cpu": cpu, "checks": counts["checks"], "git_spawns": counts["git"],
            "spawns_per_integrated": counts["git"] / max(len(landed), 1),
            "integrated": [task.task_id for task in landed], "parked": parked}


# ---------------------------------------------------------------- the run


def cpu_seconds() -> float:
    """User and system CPU time of this process and of every child it has waited for (the checks, git, the
    Executors and what they waited for): the work done, which other sessions' load on the machine does not
    inflate the way it inflates the walls (a loaded machine shares its cores by process, so the naive queue's
    one process at a time gets a smaller share than lanes-es's several)."""
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def load() -> str:
    return " ".join(f"{value:.1f}" for value in os.getloadavg())


def run_realrepo_bench(args: argparse.Namespace) -> int:
    cache = Path(args.cache or Path.home() / ".cache" / "lanes-es" / "bench")
    sdist = cached_sdist(cache)
    # The checks run `python3`: this interpreter, whose environment has pytest (the bench needs the test extra).
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", os.defpath)])
    results: dict[tuple[str, str], list[tuple[dict[str, Any], dict[str, Any]]]] = {}
    with _workspace(args.keep) as top:
        warm_up(top / "warm-up", sdist)
        for repeat in range(args.repeat):
            for case in args.cases:
                for mode in args.modes:
                    run = top / f"{case}-{mode or 'default'}-{repeat}"
                    order = ("lanes", "naive") if repeat % 2 == 0 else ("naive", "lanes")
                    measured: dict[str, dict[str, Any]] = {}
                    for side in order:
                        before = load()
                        measured[side] = (run_lanes(run / "lanes-es", sdist, case, mode, args.verify_workers, args.poll,
                                                    args.timeline)
                                          if side == "lanes" else run_naive(run / "naive", sdist, case))
                        measured[side]["load"] = f"{before} -> {load()}"
                    lanes, naive = measured["lanes"], measured["naive"]
                    results.setdefault((case, lanes["mode"]), []).append((lanes, naive))
                    _tell(case, repeat, lanes, naive, args.json)
                    if not args.keep:
                        shutil.rmtree(run, ignore_errors=True)
    return _summary(results, args.json)


def warm_up(workdir: Path, sdist: Path) -> None:
    """One untimed check of every planned task on the base, before the first measured run: in an environment
    that never ran them, the first runs compile pytest's and the interpreter's own modules to bytecode (about
    a second of CPU, once), and whichever side went first paid it (the first lanes-es run measured 1.10 where
    the next ones measured 0.89 and 0.92)."""
    planned = tasks("passing")
    make_base(workdir, sdist, planned)
    for task in planned:
        subprocess.run(task.check, cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    shutil.rmtree(workdir, ignore_errors=True)


@contextmanager
def _workspace(keep: str | None) -> Iterator[Path]:
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        yield Path(keep)
        return
    with tempfile.TemporaryDirectory(prefix="lanes-es-bench-realrepo-") as directory:
        yield Path(directory)


def _tell(case: str, repeat: int, lanes: dict[str, Any], naive: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps({"case": case, "repeat": repeat, "lanes_es": lanes, "naive": naive}), flush=True)
        return
    fixed = lanes["submit_to_first_check"]
    print(f"{case:<8} #{repeat} {lanes['mode']:<11} lanes-es {lanes['wall']:6.2f} s ({lanes['checks']} checks: "
          f"{lanes['qa_checks']} QA + {lanes['integration_checks']}, {lanes['git_spawns']} git, load "
          f"{lanes['load']}, CPU {lanes['cpu']:.1f} s) | naive {naive['wall']:6.2f} s ({naive['checks']} checks, "
          f"{naive['git_spawns']} git, load {naive['load']}, CPU {naive['cpu']:.1f} s) | ratio "
          f"{lanes['wall'] / naive['wall']:.2f}, CPU {lanes['cpu'] / naive['cpu']:.2f} | QA {lanes['qa_seconds']:.2f} s, "
          f"last submit -> first candidate check {'-' if fixed is None else f'{fixed:.2f} s'}", flush=True)
    if (lanes["integrated"], lanes["parked"]) != (naive["integrated"], naive["parked"]):
        print(f"  outcomes differ: lanes-es integrated {lanes['integrated']} parked {lanes['parked']}; naive "
              f"integrated {naive['integrated']} parked {naive['parked']}", flush=True)


def _summary(results: dict[tuple[str, str], list[tuple[dict[str, Any], dict[str, Any]]]], as_json: bool) -> int:
    rows = []
    for (case, mode), pairs in results.items():
        median = lambda values: statistics.median(values)  # noqa: E731
        rows.append({
            "case": case, "mode": mode, "runs": len(pairs),
            "lanes_es_wall": round(median([lanes["wall"] for lanes, _ in pairs]), 2),
            "naive_wall": round(median([naive["wall"] for _, naive in pairs]), 2),
            "ratio": round(median([lanes["wall"] / naive["wall"] for lanes, naive in pairs]), 2),
            "lanes_es_cpu": round(median([lanes["cpu"] for lanes, _ in pairs]), 2),
            "naive_cpu": round(median([naive["cpu"] for _, naive in pairs]), 2),
            "cpu_ratio": round(median([lanes["cpu"] / naive["cpu"] for lanes, naive in pairs]), 2),
            "lanes_es_checks": median([lanes["checks"] for lanes, _ in pairs]),
            "naive_checks": median([naive["checks"] for _, naive in pairs]),
            "lanes_es_git": median([lanes["git_spawns"] for lanes, _ in pairs]),
            "lanes_es_git_per_integrated": round(median([lanes["spawns_per_integrated"] for lanes, _ in pairs]), 1),
            "naive_git": median([naive["git_spawns"] for _, naive in pairs]),
            "qa_seconds": round(median([lanes["qa_seconds"] for lanes, _ in pairs]), 2),
            "submit_to_first_check": _median_known([lanes["submit_to_first_check"] for lanes, _ in pairs]),
            "same_outcome": all((lanes["integrated"], lanes["parked"]) == (naive["integrated"], naive["parked"])
                                for lanes, naive in pairs),
            "parked": pairs[0][0]["parked"],
        })
    if as_json:
        print(json.dumps({"summary": rows}, indent=2))
        return 0 if all(row["same_outcome"] for row in rows) else 1
    print(f"\n{PROJECT} {VERSION}, K = 8, medians (load now {load()}):")
    print("| case | mode | lanes-es | naive | ratio | CPU: lanes-es / naive (ratio) | check runs (lanes-es / naive) | "
          "git spawns (lanes-es, per integrated Lane / naive) | QA | last submit -> first candidate check | parked |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        fixed = row["submit_to_first_check"]
        print(f"| {row['case']} | {row['mode']} | {row['lanes_es_wall']:.2f} s | {row['naive_wall']:.2f} s | "
              f"{row['ratio']:.2f} | {row['lanes_es_cpu']:.1f} / {row['naive_cpu']:.1f} s ({row['cpu_ratio']:.2f}) | "
              f"{row['lanes_es_checks']:g} / {row['naive_checks']:g} | {row['lanes_es_git']:g}, "
              f"{row['lanes_es_git_per_integrated']} / {row['naive_git']:g} | {row['qa_seconds']:.2f} s | "
              f"{'-' if fixed is None else f'{fixed:.2f} s'} | {', '.join(row['parked']) or 'none'} |")
    return 0 if all(row["same_outcome"] for row in rows) else 1


def _median_known(values: list[float | None]) -> float | None:
    known = [value for value in values if value is not None]
    return round(statistics.median(known), 2) if known else None


if __name__ == "__main__":
    sys.exit(execute(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])))
