"""The audit commands: `replay`, `verify`, `export` and `audit`.

Each command is a function of an open store and the checkout root (so tests call them
directly); `register` adds thin argparse wrappers that open the store the way the rest
of the command line does.

Exit codes: 0 when every check holds, 1 when one fails (each failure printed with its
version or code), 2 for input the command cannot use (an unknown batch, a malformed export).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any, BinaryIO, Callable, TextIO

import msgspec

from lanes_es.adapters.store import DamagedLog
from lanes_es.audit.chain import StoredLogCheck, anchored_breaks, chain_head, verify_stored
from lanes_es.audit.export import ExportError, read_export_rows, stored_lines, write_lines
from lanes_es.audit.replay import (Replay, ReplayRangeError, ReplayResult, TerminalProgress, chain_breaks_up_to,
                                   check_range)
from lanes_es.audit.verify import Finding, VerifyReport, verify_batch, verify_export_events
from lanes_es.domain.ids import is_valid_id
from lanes_es.errors import naming
from lanes_es.exit_codes import EXIT_FINDING, EXIT_OK
from lanes_es.errors import ServiceError
from lanes_es.projections.audit_html import render_audit_html
from lanes_es.projections.failures import failure_lines
from lanes_es.projections.timeline import AnchorMarks, TimelineRow
from lanes_es.cli.anchor import AnchorOptions, anchor_marks

EXIT_FAILED = EXIT_FINDING  # a check that does not hold: 1, as `rebuild --check` reports drift


def register(commands: Any) -> None:
    from lanes_es.cli.main import BATCH_HELP

    command = commands.add_parser(
        "replay", help="replay a batch's log, checking every step",
        description="Print the batch's events in order (version, time, event, task, facts) and check each step: the "
                    "transition is legal from the state before it, the record passes the v2 validator, the digest "
                    "chain holds. With --at, replay up to that version and print the record as of it.")
    command.add_argument("batch_id", metavar="BATCH", help=BATCH_HELP)
    command.add_argument("--at", type=int, default=None, metavar="VERSION", help="stop at this event version")
    command.add_argument("--json", action="store_true", help="print steps, failures and the record as JSON")
    command.set_defaults(func=_replay)

    command = commands.add_parser(
        "verify", help="verify a batch: chain, projections and, when completed, the batch branch",
        description="Check the digest chain and print its head, compare the state file and report with their rebuild "
                    "from the log, and for a completed batch run upstream's completion verification of the batch "
                    "branch. With --export FILE, check an exported log without the store. Exit 0 only when all hold.")
    command.add_argument("batch_id", metavar="BATCH", nargs="?", help=BATCH_HELP)
    command.add_argument("--export", default=None, metavar="FILE", help="verify an exported log instead")
    command.add_argument("--expect-head", default=None, metavar="DIGEST",
                         help="the chain head recorded elsewhere (an earlier verify, an export); a log cut short "
                              "or rewritten since then ends at another head")
    command.add_argument("--checkpoint", default=None, metavar="FILE",
                         help="a signed checkpoint to check the log against (default: the repository's ref "
                              "refs/lanes-es/checkpoints/BATCH_ID)")
    command.add_argument("--public-key", default=None, metavar="KEY",
                         help="the public key (its text or a file holding it; default: $LANES_ES_PUBLIC_KEY, else "
                              "this repository's signing key); `lanes-es key show` prints it")
    command.add_argument("--json", action="store_true", help="print the findings as JSON")
    command.set_defaults(func=_verify)

    command = commands.add_parser(
        "export", help="write a batch's log as JSON Lines",
        description="Write the batch's events, oldest first, one JSON object per line, so that another machine can "
                    "run `lanes-es verify --export FILE` or `lanes-es rebuild --from-export FILE` without the store.")
    command.add_argument("batch_id", metavar="BATCH", help=BATCH_HELP)
    command.add_argument("-o", "--output", default=None, metavar="FILE", help="write here instead of stdout")
    command.set_defaults(func=_export)

    command = commands.add_parser(
        "audit", help="write a batch's audit page (one self-contained HTML file)",
        description="Render the batch's log as one HTML page that loads nothing from anywhere: a swimlane per task "
                    "with its transitions, parks and their reasons, integrations and their commits, tick "
                    "boundaries, and a table of every event.")
    command.add_argument("batch_id", metavar="BATCH", help=BATCH_HELP)
    command.add_argument("-o", "--output", "--html", dest="output", required=True, metavar="FILE",
                         help="the page to write (--html is the older spelling)")
    command.set_defaults(func=_audit)


# ---------------------------------------------------------------- argparse wrappers


def _open(args: argparse.Namespace) -> tuple[Any, Path]:
    from lanes_es.bootstrap import locate_repository, open_store

    repository = locate_repository(args.root)
    return open_store(repository, getattr(args, "store", None), read_only=True), repository.root


def _with_store(args: argparse.Namespace, run: Callable[[Any, Path], int]) -> int:
    """`run` on the store; a batch named by slug or id prefix (args.batch_id) is resolved to its id first."""
    from lanes_es.cli.batch_ref import resolve_batch_id

    store, root = _open(args)
    try:
        if getattr(args, "batch_id", None):
            args.batch_id = resolve_batch_id(store, args.batch_id)
        return run(store, root)
    finally:
        store.close()


def _replay(args: argparse.Namespace) -> int:
    return _with_store(args, lambda store, root: replay_command(store, args.batch_id, args.at, args.json,
                                                                 anchors=anchor_marks(root, args.batch_id)))


def _verify(args: argparse.Namespace) -> int:
    if args.export:
        if args.batch_id:
            raise ServiceError("invalid_input", "name a BATCH_ID or --export FILE, not both")
        return verify_export_command(Path(args.export), args.json, expect_head=args.expect_head,
                                     anchor=AnchorOptions.of(args))
    if not args.batch_id:
        raise ServiceError("invalid_input", "name a BATCH_ID, or --export FILE to verify an exported log")
    from lanes_es.usecases.coordinator import batch_root

    # the files a batch wrote are in its coordinator worktree while it is there (docs/concepts/coordinator.md)
    return _with_store(args, lambda store, root: verify_command(store, Path(batch_root(store, root, args.batch_id)),
                                                                 args.batch_id, args.json,
                                                                 expect_head=args.expect_head,
                                                                 anchor=AnchorOptions.of(args)))


def _export(args: argparse.Namespace) -> int:
    output = Path(args.output) if args.output else None
    return _with_store(args, lambda store, root: export_command(store, args.batch_id, output))


def _audit(args: argparse.Namespace) -> int:
    return _with_store(args, lambda store, root: audit_command(store, args.batch_id, Path(args.output),
                                                                anchors=anchor_marks(root, args.batch_id)))


# ---------------------------------------------------------------- reading a batch


def load_sound_rows(store: Any, batch_id: str) -> tuple[list[Any], list[Any]]:
    """The stored rows of a batch and their events, for a command that hands the log on (export, the audit
    page); `DamagedLog` with the pointer to `verify` when it does not verify: its rows and chain, or the size
    this machine anchored."""
    tip = _anchored_tip(store, batch_id)  # before the rows: see stream_verified_events
    rows = load_rows(store, batch_id)
    events, breaks = verify_stored(rows)
    breaks = breaks or anchored_breaks(len(rows), _row_at(rows, tip), tip)
    if breaks:
        raise DamagedLog(batch_id, breaks[0], len(breaks))
    return rows, events


def _anchored_tip(store: Any, batch_id: str) -> tuple[int, str] | None:
    return store.anchored(batch_id) if getattr(store, "anchored", None) is not None else None


def _row_at(rows: list[Any], tip: tuple[int, str] | None) -> Any:
    return rows[tip[0] - 1] if tip is not None and 0 < tip[0] <= len(rows) else None


def load_rows(store: Any, batch_id: str) -> list[Any]:
    """The stored rows of a batch, as written."""
    if not is_valid_id(batch_id):
        raise ServiceError("invalid_input", f"{batch_id!r} is not a batch id")
    rows = store.stored_events(batch_id)
    if not rows:
        raise ServiceError("batch_not_found", f"the store has no batch {batch_id}; `lanes-es status SLUG` names "
                                              f"an Initiative's batch")
    return rows


# ---------------------------------------------------------------- replay


def replay_command(store: Any, batch_id: str, at_version: int | None = None, as_json: bool = False,
                   out: TextIO | None = None, err: TextIO | None = None, anchors: AnchorMarks | None = None) -> int:
    """Replay the log as it streams from the store, a page of rows at a time: each step is written to a
    spool (memory, then a temporary file) as it is replayed, so memory stays flat however long the log,
    and the output is written whole once every check ran (a refusal prints nothing)."""
    out, err = out or sys.stdout, err or sys.stderr
    anchors = anchors or AnchorMarks()
    progress = TerminalProgress(stream=err)
    with tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES, mode="w+", encoding="utf-8") as spool:
        steps = _JsonSteps(spool) if as_json else _TextSteps(spool, anchors)
        try:
            result, count = replay_streamed(store, batch_id, at_version, steps, progress)
        finally:
            progress.finish()
        if as_json:
            _write_json_replay(result, count, anchors, spool, out)
        else:
            _copy(spool, out)
            _print_replay_end(result, count, at_version is not None, out)
    return EXIT_OK if result.ok else EXIT_FAILED


SPOOL_BYTES = 1 << 20  # a replay's output beyond this goes to a temporary file, not memory


def replay_streamed(store: Any, batch_id: str, at_version: int | None, on_step: Callable[[TimelineRow], None],
                    progress: Callable[[int, int], None]) -> tuple[ReplayResult, int]:
    """`replay` over the store's rows as they stream (every row and chain check of `verify_stored`, each
    step checked); the result carries no steps: each went to `on_step`. Returns it and the step count."""
    from lanes_es.adapters.log_reader import newest_version, stream_rows

    if not is_valid_id(batch_id):
        raise ServiceError("invalid_input", f"{batch_id!r} is not a batch id")
    tip = _anchored_tip(store, batch_id) if at_version is None else None  # before the rows
    total = newest_version(store, batch_id)
    check = StoredLogCheck()
    walk = Replay(on_step=on_step)
    rows = newest = 0
    at_tip = None
    for row in stream_rows(store, batch_id):
        rows += 1
        if tip is not None and row.originator_version == tip[0]:
            at_tip = row
        event = check.feed(row)
        if event is not None:
            newest = event.originator_version
            if at_version is None or newest <= at_version:
                walk.step(event)
        progress(rows, max(total, rows))
    if not rows:
        raise ServiceError("batch_not_found", f"the store has no batch {batch_id}; `lanes-es status SLUG` names "
                                              f"an Initiative's batch")
    try:
        check_range(at_version, newest)
    except ReplayRangeError as error:
        raise ServiceError("invalid_input", str(error)) from None
    breaks = chain_breaks_up_to(check.breaks(), at_version)
    return walk.result(breaks + ([] if breaks else anchored_breaks(rows, at_tip, tip))), walk.count


class _JsonSteps:
    """Each step as it sits in the `steps` list of the whole document (msgspec's indent=2, two levels in)."""

    def __init__(self, spool: TextIO) -> None:
        self.spool = spool
        self.encode = msgspec.json.Encoder().encode
        self.written = 0

    def __call__(self, step: TimelineRow) -> None:
        text = msgspec.json.format(self.encode(step), indent=2).decode()
        self.spool.write(("\n" if not self.written else ",\n") + "    " + text.replace("\n", "\n    "))
        self.written += 1


def _write_json_replay(result: ReplayResult, count: int, anchors: AnchorMarks, spool: Any, out: TextIO) -> None:
    """The very bytes of `json.dumps(document, indent=2)` of the whole result, its steps copied from the spool."""
    document = msgspec.to_builtins(result)
    head = {key: document.pop(key) for key in ("batch_id", "version", "head")}
    document.pop("steps")
    document["anchors"] = msgspec.to_builtins(anchors)
    out.write(msgspec.json.format(msgspec.json.encode(head), indent=2).decode()[:-2] + ',\n  "steps": [')
    if count:
        _copy(spool, out)
        out.write("\n  ]")
    else:
        out.write("]")
    out.write("," + msgspec.json.format(msgspec.json.encode(document), indent=2).decode()[1:] + "\n")


def _copy(spool: Any, out: TextIO) -> None:
    spool.seek(0)
    while chunk := spool.read(1 << 16):
        out.write(chunk)


class _TextSteps:
    """A step a line, a `-- tick` line where the tick changes, and what the anchors mark at it."""

    def __init__(self, spool: TextIO, anchors: AnchorMarks) -> None:
        self.spool = spool
        self.anchors = anchors
        self.previous_at: str | None = None

    def __call__(self, step: TimelineRow) -> None:
        out = self.spool
        if step.at != self.previous_at:
            out.write(f"-- tick {step.at}\n")
            self.previous_at = step.at
        out.write(step_text(step) + "\n")
        for line in failure_lines(step.facts):
            out.write(f"{'':>8}{line}\n")
        if step.version in self.anchors.attested:
            out.write(f"{'':>8}attested: {self.anchors.attested[step.version]}\n")
        for root in self.anchors.checkpoint_at(step.version):
            out.write(f"-- checkpoint signed: {step.version} events, root {root}\n")


def _print_replay_end(result: ReplayResult, count: int, show_record: bool, out: TextIO) -> None:
    failures = result.failures
    for failure in failures:
        out.write(f"FAIL {failure.describe()}\n")
    if result.checks_stopped_at is not None:
        out.write(f"(state checks stopped after version {result.checks_stopped_at}: the record after it is not "
                  f"trustworthy)\n")
    state = result.record["batch_state"] if result.record else "none"
    verdict = "every check holds" if not failures else f"{len(failures)} check(s) failed"
    out.write(f"replayed {count} events of {result.batch_id} to version {result.version}: "
              f"batch {state}, chain head {result.head}; {verdict}\n")
    if show_record and result.record is not None:
        out.write(f"record as of version {result.version}:\n")
        out.write(json.dumps(result.record, indent=2, ensure_ascii=False) + "\n")


def step_text(step: TimelineRow) -> str:
    transition = f" [{step.transition}]" if step.transition else ""
    task = f" {step.task_id}" if step.task_id else ""
    facts = " ".join(f"{name}={_fact(value)}" for name, value in step.facts.items())
    return f"{step.version:>6}  {step.at}  {step.event}{task}{transition}" + (f"  {facts}" if facts else "")


def _fact(value: Any) -> str:
    if isinstance(value, str):
        return value if value and " " not in value else json.dumps(value, ensure_ascii=False)
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


# ---------------------------------------------------------------- verify


def verify_command(store: Any, root: Path, batch_id: str, as_json: bool = False, out: TextIO | None = None,
                   err: TextIO | None = None, expect_head: str | None = None,
                   anchor: "AnchorOptions | None" = None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    rows = load_rows(store, batch_id)
    events, stored_breaks = verify_stored(rows)
    progress = TerminalProgress(stream=err, label="verifying")
    try:
        report = verify_batch(batch_id, events, root, stored_breaks, progress=progress)
    finally:
        progress.finish()
    _check_head(report, expect_head)
    (anchor or AnchorOptions()).check(report, rows, events, root)
    _print_verify(report, as_json, out)
    return EXIT_OK if report.ok else EXIT_FAILED


def verify_export_command(path: Path, as_json: bool = False, out: TextIO | None = None,
                          err: TextIO | None = None, expect_head: str | None = None,
                          anchor: "AnchorOptions | None" = None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    try:
        rows, events, stored_breaks = read_export_rows(path)
    except ExportError as error:
        if not path.is_file():  # nothing to verify: a wrong path is bad input, not a finding
            raise ServiceError("invalid_export", str(error)) from None
        # A damaged export is what verify is for: the damage is its finding, not a refusal.
        damaged = VerifyReport(batch_id=path.name, events=0, head="", batch_state=None,
                               findings=[Finding(check="export", version=None, code="unreadable_export",
                                                 message=str(error))])
        _print_verify(damaged, as_json, out)
        return EXIT_FAILED
    progress = TerminalProgress(stream=err, label="verifying")
    try:
        report = verify_export_events(events, progress=progress, stored_breaks=stored_breaks)
    finally:
        progress.finish()
    _check_head(report, expect_head)
    (anchor or AnchorOptions()).check(report, rows, events, None)
    _print_verify(report, as_json, out)
    return EXIT_OK if report.ok else EXIT_FAILED


def _check_head(report: VerifyReport, expect_head: str | None) -> None:
    """A chain that holds can still have lost its newest events; only a head kept elsewhere shows it."""
    if expect_head is not None and report.head != expect_head:
        report.findings.append(Finding(check="chain", version=report.events, code="head_mismatch",
                                       message=f"the chain ends at {report.head}, not at the expected head "
                                               f"{expect_head}: events were removed or replaced since it was recorded"))


def _print_verify(report: VerifyReport, as_json: bool, out: TextIO) -> None:
    if as_json:
        document = msgspec.to_builtins(report)
        document["ok"] = report.ok
        out.write(json.dumps(document, indent=2, ensure_ascii=False) + "\n")
        return
    out.write(f"batch {report.batch_id}: {report.events} events, state {report.batch_state or 'unknown'}\n")
    out.write(f"chain head {report.head}\n")
    if report.checkpoint is not None:
        out.write(f"checkpoint {report.checkpoint['size']} events, root {report.checkpoint['root']} "
                  f"({report.checkpoint['source']})\n")
    for note in report.notes:
        out.write(f"note: {note}\n")
    for finding in report.findings:
        out.write(f"FAIL {finding.describe()}\n")
    if report.completion is not None and report.completion["complete"]:
        out.write(f"completion: verified {len(report.completion['children'])} children on the batch branch\n")
    if report.ok:
        out.write("verified: every check holds\n")
    else:
        out.write(f"NOT verified: {len(report.findings)} finding(s)\n")


# ---------------------------------------------------------------- export and audit


def export_command(store: Any, batch_id: str, output: Path | None, out: BinaryIO | None = None,
                   err: TextIO | None = None) -> int:
    """Write the export to `output`, or to `out` (stdout) when no file is named.

    The lines are the rows as stored, so old events keep the bytes they were sealed with.
    """
    rows, events = load_sound_rows(store, batch_id)
    if output is None:
        stream = out or sys.stdout.buffer
        for line in stored_lines(rows):
            stream.write(line)
        stream.flush()
        return EXIT_OK
    count = write_lines(stored_lines(rows), output)
    (err or sys.stderr).write(f"wrote {count} events of {batch_id} to {output} (chain head {chain_head(events)})\n")
    return EXIT_OK


def audit_command(store: Any, batch_id: str, html_path: Path, out: TextIO | None = None,
                  anchors: AnchorMarks | None = None) -> int:
    _, events = load_sound_rows(store, batch_id)
    page = render_audit_html(batch_id, events, anchors)
    with naming(html_path):
        html_path.parent.mkdir(parents=True, exist_ok=True)
        html_path.write_text(page, encoding="utf-8")
    (out or sys.stdout).write(f"wrote the audit page of {batch_id} ({len(events)} events) to {html_path}\n")
    return EXIT_OK
