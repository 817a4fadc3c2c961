"""`lanes-es intent overlap PATH PATH... [--json]`: upstream's read-only overlap report.

Which TaskIntents share scope, entry pair by entry pair, and the start waves that keeps
them apart (`assurance_kernel/intent_scope_overlap/v1`, scenario LANE-GRP-07; upstream's
`imm-kernel intent overlap`). It reads the given files and writes nothing; never write
"disjoint" or "verified" for scopes by hand, run this.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from lanes_es.domain.inputs import InvalidInput
from lanes_es.domain.intent import InvalidIntent, parse_task_intent
from lanes_es.domain.jstext import parse_json_file_text
from lanes_es.domain.scheduling import project_scope_overlap

MAX_INTENT_BYTES = 64 * 1024


def register(subparsers: Any) -> None:
    group = subparsers.add_parser("intent", help="read-only reports on TaskIntent files",
                                  description="Read-only reports on TaskIntent files (docs/plans/<task>.intent.json).")
    group.set_defaults(func=lambda args: (group.print_help(), 2)[1])
    commands = group.add_subparsers(title="intent commands", metavar="INTENT_COMMAND")
    overlap = commands.add_parser(
        "overlap", help="which intents share scope, and the start waves (writes nothing)",
        description="The assurance_kernel/intent_scope_overlap/v1 report of two or more TaskIntent files: each "
                    "pair whose scope_hint entries overlap, with the entry pairs, and the parallel groups.")
    overlap.add_argument("paths", nargs="+", metavar="PATH", help="TaskIntent files")
    overlap.add_argument("--json", action="store_true", help="print the report as JSON")
    overlap.set_defaults(func=run_overlap)


def run_overlap(args: argparse.Namespace) -> int:
    report = project_scope_overlap([read_intent_file(path) for path in args.paths])
    if args.json:
        print(json.dumps(report, indent=2, ensure_ascii=False))
        return 0
    for pair in report["overlaps"]:
        left, right = pair["task_ids"]
        print(f"{left} overlaps {right}: " + "; ".join(f"{x} ~ {y}" for x, y in pair["entries"]))
    if not report["overlaps"]:
        print("no scope overlaps")
    print("parallel groups: " + " | ".join(", ".join(group) for group in report["parallel_groups"]))
    return 0


def read_intent_file(path: str) -> dict[str, Any]:
    """A TaskIntent file, parsed and normalized; InvalidInput names the file and what is wrong."""
    file = Path(path)
    if file.is_symlink() or not file.is_file():
        raise InvalidInput(f"invalid intent {path}: not a regular file")
    from lanes_es.adapters.files import FileTooLarge, read_capped

    try:
        data = read_capped(file, MAX_INTENT_BYTES)
    except FileTooLarge:
        raise InvalidInput(f"invalid intent {path}: larger than 64 KiB") from None
    try:
        return parse_task_intent(parse_json_file_text(data))
    except (InvalidIntent, ValueError) as error:
        raise InvalidInput(f"invalid intent {path}: {error}") from None
