"""The one way lanes-es runs git: `sh`, no program the repository's config names, no prompt, counted.

Every spawn costs milliseconds (about 7 ms through `sh` here), so each call is
counted and timed in `STATS`; a tick reports them with `LANES_ES_STATS=<file>`.
Nothing else in the project imports `sh` or `subprocess` to run git. Each call is given,
in its own arguments and environment (no spawn more), the overrides of every key that
can name a program (lanes_es/adapters/git_programs.py): hooks, filters, merge drivers,
fsmonitor, editors, signing, transports and their helpers.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from lanes_es.adapters.git_programs import FIXED_CONFIG, FIXED_ENV, config_env, driver_config
from lanes_es.ports import GitFailure

DEFAULT_AUTHOR_NAME = "Immune-Brain Batch"
DEFAULT_AUTHOR_EMAIL = "immune-brain@local"

_GIT: list[Any] = []  # sh's git command, made on the first spawn
RUNNER_CONFIG = tuple(argument for key, value in FIXED_CONFIG for argument in ("-c", f"{key}={value}"))


def _git_command() -> Any:
    """sh and its imports (asyncio among them, tens of ms) are paid only by a command that runs git."""
    if not _GIT:
        import sh

        _GIT.append(sh.Command("git"))
    return _GIT[0]


@dataclass
class SpawnStats:
    """Counters of the process's git spawns; a tick reports what changed while it ran (`snapshot`).

    `seconds` adds up every spawn's time, so spawns run at once from several threads (QA, candidate
    checks) count each; `busy_seconds` is the wall time during which at least one git ran."""

    spawns: int = 0
    seconds: float = 0.0
    busy_seconds: float = 0.0
    commands: list[str] = field(default_factory=list)
    keep_commands: bool = False
    running: int = 0
    busy_since: float = 0.0

    def reset(self) -> None:
        self.spawns = 0
        self.seconds = 0.0
        self.busy_seconds = 0.0
        self.commands.clear()

    def snapshot(self) -> tuple[int, float, float]:
        """(spawns, seconds, busy seconds) so far, a git still running counted up to now."""
        with _STATS_LOCK:
            busy = self.busy_seconds + (time.perf_counter() - self.busy_since if self.running else 0.0)
            return self.spawns, self.seconds, busy

    def started(self, now: float) -> None:
        if not self.running:
            self.busy_since = now
        self.running += 1

    def ended(self, started: float, now: float) -> None:
        self.seconds += now - started
        self.running -= 1
        if not self.running:
            self.busy_seconds += now - self.busy_since


STATS = SpawnStats()
_STATS_LOCK = threading.Lock()  # QA and candidate verifications spawn git from several threads

# Called with the git arguments after every spawn, whatever its outcome. Tests use it to
# inject a crash right after a git command took effect; nothing in the engine registers one.
SPAWN_OBSERVERS: list[Callable[[tuple[str, ...]], None]] = []


@dataclass(frozen=True)
class GitResult:
    exit_code: int
    stdout: bytes
    stderr: bytes

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def text(self) -> str:
        """stdout decoded (invalid UTF-8 replaced), trailing newline stripped."""
        return self.stdout.decode("utf-8", "replace").rstrip("\n")

    @property
    def error_text(self) -> str:
        return self.stderr.decode("utf-8", "replace").strip()


def git_env(extra: Mapping[str, str] | None = None, root: str | None = None) -> dict[str, str]:
    """The caller's environment plus what keeps git quiet, lock-free and from running any program the
    repository at `root` names (sh's _env replaces the environment whole)."""
    env = dict(os.environ)
    env.update({"GIT_TERMINAL_PROMPT": "0", "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C", **FIXED_ENV})
    if extra:
        env.update(extra)
    drivers = driver_config(root) if root is not None else []
    if drivers:
        env.update(config_env(drivers, env))
    return env


def batch_identity_env() -> dict[str, str]:
    """Author and committer from the environment, else upstream's batch identity."""
    return {
        "GIT_AUTHOR_NAME": os.environ.get("GIT_AUTHOR_NAME", DEFAULT_AUTHOR_NAME),
        "GIT_AUTHOR_EMAIL": os.environ.get("GIT_AUTHOR_EMAIL", DEFAULT_AUTHOR_EMAIL),
        "GIT_COMMITTER_NAME": os.environ.get("GIT_COMMITTER_NAME", DEFAULT_AUTHOR_NAME),
        "GIT_COMMITTER_EMAIL": os.environ.get("GIT_COMMITTER_EMAIL", DEFAULT_AUTHOR_EMAIL),
    }


def git(root: str, *args: str, ok_codes: Sequence[int] = (0,), stdin: bytes | str | None = None,
        env: Mapping[str, str] | None = None, timeout: float | None = None) -> GitResult:
    """Run `git -C root <RUNNER_CONFIG> <args>` in `git_env` (lanes_es/adapters/git_programs.py says why each).

    Exit codes in `ok_codes` return a GitResult; any other raises GitFailure with
    git's own words. Output is bytes; decode where the format is known.

    `maintenance.auto=false`: a `commit` or `merge` would otherwise start `git maintenance run --auto`,
    one more git process each time, and when the repository crosses git's thresholds a repack (in the
    background by default) of the user's repository while the tick goes on reading it. Housekeeping
    is the user's git's business, which still does it on the user's own commands.
    """
    argv = ["-C", root, *RUNNER_CONFIG, *args]
    started = time.perf_counter()
    with _STATS_LOCK:
        STATS.spawns += 1
        STATS.started(started)
        if STATS.keep_commands:
            STATS.commands.append(" ".join(args[:3]))
    # sh's `_timeout` polls and adds about 100 ms to every call, so it is passed only when asked for.
    options: dict[str, object] = {"_timeout": timeout} if timeout is not None else {}
    command = _git_command()
    import sh

    try:
        process = command(*argv, _env=git_env(env, root), _tty_out=False, _ok_code=list(ok_codes), _in=stdin,
                       _return_cmd=True, **options)
        return GitResult(process.exit_code, process.stdout, process.stderr)
    except sh.ErrorReturnCode as error:
        detail = error.stderr.decode("utf-8", "replace").strip() or error.stdout.decode("utf-8", "replace").strip()
        raise GitFailure(f"git {' '.join(args[:2])} failed ({error.exit_code}): {detail}") from None
    except sh.TimeoutException:
        raise GitFailure(f"git {' '.join(args[:2])} timed out after {timeout}s") from None
    except sh.CommandNotFound:
        raise GitFailure("git is not installed or not on PATH") from None
    finally:
        with _STATS_LOCK:
            STATS.ended(started, time.perf_counter())
        for observer in SPAWN_OBSERVERS:
            observer(args)


def git_ok(root: str, *args: str, **options: object) -> GitResult:
    """Run git accepting any exit code; the caller reads `exit_code`."""
    return git(root, *args, ok_codes=range(0, 256), **options)  # type: ignore[arg-type]


def cat_file_batch(root: str, names: Sequence[str]) -> list[tuple[str, str, bytes] | None]:
    """`git cat-file --batch` of each name: (object id, type, content), None for a missing one. One spawn."""
    if not names:
        return []
    output = git(root, "cat-file", "--batch", stdin="".join(f"{name}\n" for name in names).encode()).stdout
    results: list[tuple[str, str, bytes] | None] = []
    position = 0
    for _ in names:
        end = output.index(b"\n", position)
        header = output[position:end].decode("utf-8", "replace").split(" ")
        position = end + 1
        if len(header) != 3 or header[1] == "missing" or header[-1] == "missing":
            results.append(None)
            continue
        size = int(header[2])
        results.append((header[0], header[1], output[position:position + size]))
        position += size + 1
    return results
