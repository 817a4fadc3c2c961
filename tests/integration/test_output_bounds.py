"""A user's program that writes 50 MB, through the real autopilot (`lanes-es run` in a subprocess) on a real
repository and store (SQLite and PostgreSQL): an acceptance check in the Lane's QA and in the candidate rerun,
a final verification command, a tracker command. Each is cut off or read with bounded memory (the
coordinator's peak memory stays far below what it was written), what is recorded is bounded (a digest and a
byte count, an excerpt with the sha256 of the whole), and the batch goes on: the task is sent back to rework,
never a crash.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lanes_es.adapters.qa import READ_CHUNK
from tests.engine import Task, initiative_markdown
from tests.gitfixtures import descriptor, intent_json, make_repo

pytestmark = pytest.mark.usefixtures("store_url")

PROJECT = str(Path(__file__).resolve().parents[2])
SLUG = "loud"
FIFTY_MB = 50 * 1024 * 1024
LIMIT = 4096  # each check's max_output_bytes
# Writes 50 MB to stdout in 1 MiB pieces (never 50 MB in memory) when the condition holds (one line: a
# descriptor's argv entry holds no control character).
LOUD = "import os, sys; w = sys.stdout.buffer.write; [w(b'x' * 1048576) for _ in range(50 if {condition} else 0)]; "
# A `lanes-es run` peaks near 45 MiB; one that read a 50 MB output whole would pass this (subprocess's
# capture joins the pieces it read: twice the output at once).
PEAK_MEMORY_KIB = 100 * 1024
EXECUTOR = f"{sys.executable} -P -m lanes_es.cli.example_executor"
TASKS = ("loud-qa", "loud-candidate", "quiet", "calm")


def holds(path: str, line: str, loud_when: str = "False") -> str:
    """Passes when `path` holds `line`; first writes 50 MB when `loud_when` (a Python expression) holds."""
    check = LOUD.format(condition=loud_when) + f"sys.exit(0 if {line!r} in open({path!r}).read() else 1)"
    return descriptor(["-c", check], max_output_bytes=LIMIT)


def make_initiative(root: Path, checks: dict[str, str]) -> str:
    intents = {task: intent_json(task, [f"{task}.txt"], verification=check) for task, check in checks.items()}
    tasks = {task: Task([f"{task}.txt"]) for task in checks}
    return make_repo(root, intents=intents, files={f"docs/initiatives/{SLUG}.md": initiative_markdown(tasks)})


def autopilot(root: str, lanes: Path, *extra: str, env: dict[str, str] | None = None, executor: str = EXECUTOR
              ) -> tuple[subprocess.CompletedProcess[str], int]:
    """`lanes-es run` to its end, as a user runs it; its exit and the coordinator's peak memory (KiB)."""
    peak = lanes.parent / "peak-kib"
    # VmHWM, the high-water mark of this process's own memory since exec: ru_maxrss is kept across exec
    # (Linux), so a child of a large pytest worker would report the worker's size.
    prelude = ("import atexit, re\natexit.register(lambda: open(%r, 'w').write(re.search(r'VmHWM:\\s*(\\d+)', "
               "open('/proc/self/status').read()).group(1)))\n" % str(peak))
    hint = json.dumps({task: {"path": f"{task}.txt", "content": "delivered\n"} for task in TASKS})
    code = f"{prelude}import sys\nfrom lanes_es.cli.main import main\nsys.exit(main(sys.argv[1:]))"
    result = subprocess.run([sys.executable, "-c", code, "--root", root, "run", SLUG, "--max-parallel", "3",
                             "--lanes-dir", str(lanes), "--executor", executor, "--yes", *extra],
                            cwd=root, text=True, capture_output=True, stdin=subprocess.DEVNULL, timeout=300,
                            env={**os.environ, "PYTHONPATH": PROJECT, "LANES_ES_EXECUTOR_HINT": hint, **(env or {})})
    return result, int(peak.read_text())


def batch_events(root: str) -> list[dict[str, Any]]:
    """The batch's whole log as `lanes-es export` gives it (one JSON object per event)."""
    status = subprocess.run([sys.executable, "-m", "lanes_es.cli.main", "--root", root, "status", SLUG, "--json"],
                            cwd=PROJECT, capture_output=True, text=True, check=True)
    batch_id = json.loads(status.stdout)["batch_id"]
    exported = subprocess.run([sys.executable, "-m", "lanes_es.cli.main", "--root", root, "export", batch_id],
                              cwd=PROJECT, capture_output=True, text=True, check=True)
    return [json.loads(line) for line in exported.stdout.splitlines()]


def digests(events: list[dict[str, Any]], task_id: str) -> list[dict[str, Any]]:
    """Every output digest recorded for `task_id`'s check: Lane QA failures and candidate verdicts."""
    found = []
    for event in events:
        found += [d for d in event.get("qa_outputs", []) if d["id"].startswith(f"{task_id}:")]
        # A candidate's checks: on its verdict, or on the park its failure made.
        for verdict in event.get("checks", []) + event.get("failed_checks", []):
            found += [d for d in verdict.get("outputs", []) if d["id"].startswith(f"{task_id}:")]
    return found


def cut_off(digest: dict[str, Any]) -> bool:
    """Read past the limit, and not much more: the check was killed, not read to its 50 MB."""
    return not digest["passed"] and LIMIT < digest["output_bytes"] <= LIMIT + READ_CHUNK and digest["output_sha256"]


# loud-candidate's Executor delivers once calm is on the batch branch: its Lane (made before) does not hold
# calm's work and its candidate does, whatever order the Lanes' QA ends in. loud-qa's delivers once
# loud-candidate's candidate failed (its ref kept): its second QA failure asks the coordinator for a
# correction, which ends the run, and a run ended before loud-candidate's candidate ran would record no
# digest of it (seen under CI's load).
AFTER_CALM = """\
import os, subprocess, sys, time
# A git command that prints something once the Executor may deliver.
waits_for = {"loud-candidate": ["git", "rev-parse", "--verify", "-q", "imm/loud:calm.txt"],
             "loud-qa": ["git", "for-each-ref", "--count=1", "--format=x", "refs/lanes-es/failed/*/loud-candidate"]}
ready = waits_for.get(os.environ["LANES_ES_TASK_ID"])
for _ in range(1200 if ready else 0):
    if subprocess.run(ready, capture_output=True, text=True).stdout.strip():
        break
    time.sleep(0.1)
os.execv(sys.executable, [sys.executable, "-P", "-m", "lanes_es.cli.example_executor"])
"""


def test_a_check_writing_50_mb_is_cut_off_in_lane_qa_and_in_the_candidate_rerun_and_the_batch_goes_on(tmp_path):
    root = make_initiative(tmp_path / "repo", {
        "loud-qa": holds("loud-qa.txt", "delivered", loud_when="True"),
        # Loud on its candidate, which holds calm's work, not in its Lane.
        "loud-candidate": holds("loud-candidate.txt", "delivered", loud_when="os.path.exists('calm.txt')"),
        "calm": holds("calm.txt", "delivered"),
    })
    after_calm = tmp_path / "after-calm.py"
    after_calm.write_text(AFTER_CALM)
    result, peak = autopilot(root, tmp_path / "lanes", executor=f"{sys.executable} {after_calm}")
    said = result.stdout + result.stderr
    assert result.returncode == 3, said[-3000:]  # a person decides on the two loud tasks; no internal error
    assert "Traceback" not in said and "internal error" not in said
    assert peak < PEAK_MEMORY_KIB, peak
    status = json.loads(subprocess.run([sys.executable, "-m", "lanes_es.cli.main", "--root", root, "status", SLUG, "--json"],
                                       cwd=PROJECT, capture_output=True, text=True, check=True).stdout)
    children = {child["task_id"]: child for child in status["children"]}
    assert children["calm"]["state"] in ("integrated", "released"), children
    events = batch_events(root)
    assert any(cut_off(d) for d in digests(events, "loud-qa")), digests(events, "loud-qa")
    assert any(cut_off(d) for d in digests(events, "loud-candidate")), (digests(events, "loud-candidate"), children)
    lane = subprocess.run([sys.executable, "-m", "lanes_es.cli.main", "--root", str(tmp_path / "lanes" / "loud-qa"), "task",
                           "status", "--json"], cwd=PROJECT, capture_output=True, text=True, check=True)
    assert json.loads(lane.stdout)["findings"] == [{"id": "loud-qa:A1", "reason": f"output exceeded {LIMIT} bytes"}]
    assert children["loud-qa"]["state"] == "enrolled"  # back to rework, its coordinator correction due
    assert children["loud-candidate"]["state"] == "needs_human"
    assert children["loud-candidate"]["reason"].startswith("batch_integration_check_failed: loud-candidate:A1 failed")


TRACKER = """\
import json, sys
json.load(sys.stdin)
piece = b'y' * 1048576
for _ in range(50):
    sys.stderr.buffer.write(piece)
sys.stdout.write(json.dumps({"status": "updated", "message": "z" * %d}))
""" % (FIFTY_MB // 8)


def test_final_verification_and_a_tracker_writing_50_mb_cost_no_memory_and_record_an_excerpt(tmp_path):
    root = make_initiative(tmp_path / "repo", {"quiet": holds("quiet.txt", "delivered")})
    tracker = tmp_path / "tracker.py"
    tracker.write_text(TRACKER)
    result, peak = autopilot(root, tmp_path / "lanes", "--final-verification", f"head -c {FIFTY_MB} /dev/zero",
                             env={"LANES_ES_TRACKER_COMMAND": f"{sys.executable} {tracker}"})
    said = result.stdout + result.stderr
    assert result.returncode == 0, said[-3000:]
    assert "Traceback" not in said and "internal error" not in said
    assert peak < PEAK_MEMORY_KIB, peak
    events = batch_events(root)
    extras = [event["extras"] for event in events if isinstance(event.get("extras"), dict)]  # each tick's
    final = [extra["final_verification"] for extra in extras if extra.get("final_verification")]
    assert final and final[-1]["passed"], final
    observed = [o for extra in extras for o in extra.get("tracker_observations", [])]
    assert observed and all(len(o["message"]) < 3000 for o in observed), [len(o["message"]) for o in observed]
    import hashlib

    whole = json.dumps({"status": "updated", "message": "z" * (FIFTY_MB // 8)}).encode()  # what it answered

    assert any(f"truncated: {len(whole)} bytes, sha256 {hashlib.sha256(whole).hexdigest()}" in o["message"]
               for o in observed), observed


def test_a_tracker_message_too_long_for_the_log_is_an_excerpt_with_the_digest_of_the_whole(tmp_path):
    """The adapter alone (the autopilot above goes through it): a valid answer whose message would fill the log."""
    import hashlib

    from lanes_es.adapters.tracker import MESSAGE_CHARS, CommandTracker

    long = "m" * 10_000
    answer = tmp_path / "tracker.py"
    answer.write_text(f"import json, sys\njson.load(sys.stdin)\nprint(json.dumps({{'status': 'updated', "
                      f"'message': {long!r}}}))\n")
    result = CommandTracker(f"{sys.executable} {answer}").mark_terminal(str(tmp_path), "t", "done", "e")
    assert result.status == "updated"
    assert result.message == (f"{long[:MESSAGE_CHARS]}... (truncated: 10000 bytes, sha256 "
                              f"{hashlib.sha256(long.encode()).hexdigest()})")
