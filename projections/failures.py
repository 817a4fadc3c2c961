"""Why a check failed, and when: the lines `status`, `replay`, the run's board and the audit page show. Pure.

They read an event's facts as the timeline has them (plain JSON values): a Parked event's failed
checks and the candidate it kept, a failed CandidateVerified's checks, a failed QA's outputs. Each
failed command is shown with its reason, when it started and how long it ran, then the last lines of
its output (the log keeps a bounded tail, and the sha256 and length of the whole).
"""

from __future__ import annotations

from typing import Any

TAIL_LINES = 12


def failed_outputs(facts: dict[str, Any]) -> list[dict[str, Any]]:
    """The failed, finished commands an event's facts carry (a cancelled one is no failure)."""
    outputs = [output for output in facts.get("qa_outputs") or [] if not output.get("passed")]
    for check in [*(facts.get("failed_checks") or []), *(facts.get("checks") or [])]:
        if check.get("passed") or check.get("cancelled"):
            continue
        outputs += [output for output in check.get("outputs") or [] if not output.get("passed")]
    return outputs


def failure_lines(facts: dict[str, Any], tail_lines: int = TAIL_LINES) -> list[str]:
    """What a person reads about the failures an event records: each failed command and its output's tail,
    and where the failed candidate is kept."""
    lines: list[str] = []
    ref = facts.get("candidate_ref")
    if ref:
        lines.append(f"failed candidate {str(facts.get('candidate') or '')[:12]} kept as {ref} "
                     f"(git log -1 {ref}; git worktree add DIR {ref})")
    for output in failed_outputs(facts):
        lines.append(output_heading(output))
        tail = output.get("output_tail")
        if tail:
            shown = tail.splitlines()[-tail_lines:]
            lines += [f"  | {line}" for line in shown]
        elif output.get("output_sha256") is None and not output.get("reason"):
            lines.append("  (it never started)")
    return lines


def output_heading(output: dict[str, Any]) -> str:
    """`<task>:<item>: <reason>, started <when>, ran <seconds> s, <bytes> bytes of output`."""
    parts = [str(output.get("reason") or "failed")]
    if output.get("started_at"):
        parts.append(f"started {output['started_at']}")
    if output.get("duration_ms") is not None:
        parts.append(f"ran {output['duration_ms'] / 1000:.2f} s")
    if output.get("output_sha256"):
        parts.append(f"{output.get('output_bytes', 0)} bytes of output, sha256 {output['output_sha256'][:12]}")
    return f"{output.get('id')}: {', '.join(parts)}"
