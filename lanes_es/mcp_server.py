"""`lanes-es mcp`: upstream's batch tools for an agent host, over MCP on stdio.

Tools (docs/upstream.md#authorization-reuse-and-the-tool-surface):
- `start_unattended_batch`: one tick of the Initiative's lane batch, with upstream's input
  schema (initiative_slug, max_parallel, lane_offers, final_verification, lane_instruction,
  lane_revision). Arguments are parsed with upstream's limits and messages before any gate
  opens or anything is written. Without a valid authorization the confirmation facts are put
  to the user through MCP form elicitation (a `confirm` boolean and upstream's
  `delegate_in_lane_revisions`, default false); a client that cannot elicit gets the facts
  back with a refusal naming the `lanes-es authorize` command that confirms them.
- `retire_stale_batch`: the active batch becomes `superseded`, after the same kind of gate.
- `batch_status`, `batch_timeline`: read-only views of a batch's record and event log.

Every result is a JSON object, as structured content and as text: `state` (`started`,
`retired`, `status`, `timeline`, or `rejected` / `blocked` / `cancelled` with `reason_key`,
`reason` and `recovery_action`). A result whose state is not what the call asked for is
flagged `isError`. The MCP Python SDK 2.x is the `mcp` extra: `pip install 'lanes-es[mcp]'`.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import json
import secrets
import shlex
from dataclasses import dataclass, replace
from typing import Any

import msgspec

from lanes_es.adapters.store import StoreConflict, StoreError
from lanes_es.adapters.store_open import outage_refusal, privilege_refusal
from lanes_es.domain.inputs import (
    InvalidInput, parse_final_verification, parse_lane_instruction, parse_lane_offers, parse_lane_revision,
    parse_max_parallel, resolve_lane_parallel,
)
from lanes_es.errors import Refusal, ServiceError
from lanes_es.tick_input import InstructionInput, LaneOfferInput, RevisionInput
from lanes_es.projections.timeline import timeline
from lanes_es.usecases.confirmation import BatchOptions, Confirmation, prepare_confirmation
from lanes_es.usecases.deps import Deps
from lanes_es.usecases.gate import (
    REVISION_DELEGATION_TEXT, Answer, authorization_needed, close_gate, confirmation_text, facts_digest,
)
from lanes_es.usecases.load import initiative
from lanes_es.usecases.lock import BatchBusy
from lanes_es.usecases.retire import RetireTarget, retire_and_remove_coordinator, retire_target as read_retire_target
from lanes_es.usecases.status import recorded_max_parallel
from lanes_es.usecases.tick import tick as tick_batch

SERVER_NAME = "lanes-es"
START, RETIRE, STATUS, TIMELINE = "start_unattended_batch", "retire_stale_batch", "batch_status", "batch_timeline"
CONFIRM_KEY = "confirm_batch"
RETIRE_KEY = "confirm_retire"
BLOCKED = frozenset({"stale_batch_in_flight", "claim_already_active", "batch_state_unreadable",
                     "claim_appeared_during_confirmation", "store_busy", "batch_busy"})
CANCELLED = frozenset({"confirmation_cancelled", "cancelled_before_execution"})
CORRECT_ARGUMENTS = "Correct the arguments and call {tool} again."
STORE_RECOVERY = "Tell the user what the reason says about the event store; once it is fixed, call {tool} again."
# What to do after each refusal of a use case, in the words of an MCP host.
RECOVERY = {
    "invalid_slug": "Pass the slug of an Initiative file docs/initiatives/<slug>.md, then call {tool} again.",
    "empty_enrollable_set": "Every task of the Initiative is settled or excluded (`lanes-es plan <slug>` says why); "
                            "add or fix tasks, then call {start} again.",
    "plan_projection_failed": "Fix the Initiative file or the task intents it names, then call {start} again.",
    "batch_parallel_mismatch": "Call {start} again without max_parallel, or with the recorded value.",
    "plan_changed": "Call {tool} again: the user decides on the facts as they are now.",
    "head_moved": "Call {tool} again: the user decides on the facts as they are now.",
    "batch_authorization_invalid": "Call {start} with max_parallel: the user confirms a batch first.",
    "confirmation_failed": "Call {start} again for a fresh confirmation.",
    "uncommitted_head": "Commit the base in the coordinator checkout, then call {start} again.",
    "stale_batch_absent": "Nothing to retire: {start} starts a new batch.",
    "stale_batch_in_flight": "settle or stop the in-flight child (call {start} until its Lane settles, or run "
                             "`lanes-es task stop` in its Lane), then call {retire} again.",
    "batch_not_found": "Call {start} with max_parallel to confirm and start a batch.",
    "invalid_batch_id": "Pass one of the Initiative's batch ids (batch_status lists the active one).",
}

INSTRUCTIONS = """\
lanes-es runs an Initiative's tasks in parallel git worktrees (Lanes) and integrates each onto
the batch branch imm/<slug> under guard. Drive a batch by calling start_unattended_batch
repeatedly for the same initiative_slug: the first call (with max_parallel) confirms the batch
with the user and ticks; each report lists handoffs. Provision handoffs: make a worktree
`git worktree add -b <lane_branch> <dir> <base_head>` and pass it in lane_offers on the next
call. Executor handoffs: run the task's Executor in that Lane (it ends with `lanes-es task
submit`), then call again. Release handoffs: remove the clean Lane. Coordinator handoffs: send
one correction as lane_instruction kind "correction". batch_status and batch_timeline read the
batch without changing it."""

SLUG_SCHEMA = {"type": "string", "description": "the Initiative: docs/initiatives/<slug>.md in the coordinator"}
BATCH_ID_SCHEMA = {"type": "string", "description": "one of the Initiative's batch ids (default: its active or latest batch)"}

START_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "initiative_slug": SLUG_SCHEMA,
        "max_parallel": {"type": "integer", "minimum": 1,
                         "description": "Lanes in flight at once; required to start, optional to resume"},
        "lane_offers": {
            "type": "array",
            "description": "Lanes made for provision handoffs: absolute worktree paths",
            "items": {"type": "object", "properties": {"task_id": {"type": "string"}, "path": {"type": "string"}},
                      "required": ["task_id", "path"], "additionalProperties": False},
        },
        "final_verification": {"type": "array", "minItems": 1, "maxItems": 8, "items": {"type": "string"},
                               "description": "plain-argv commands run on the batch branch before completion"},
        "lane_instruction": {
            "type": "object",
            "description": "an instruction, or a coordinator's correction, for one Lane's Executor",
            "properties": {"task_id": {"type": "string"}, "kind": {"type": "string", "enum": ["instruction", "correction"]},
                           "text": {"type": "string"},
                           "session_state": {"type": "string", "enum": ["idle", "working", "blocked", "done"]}},
            "required": ["task_id", "text", "session_state"],
            "additionalProperties": False,
        },
        "lane_revision": {
            "type": "object",
            "description": "a breaking TaskIntent revision for one Lane, under the delegation the user granted",
            "properties": {"task_id": {"type": "string"}, "next_intent": {"type": "object"}},
            "required": ["task_id", "next_intent"],
            "additionalProperties": False,
        },
    },
    "required": ["initiative_slug"],
}
SLUG_ONLY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {"initiative_slug": SLUG_SCHEMA},
                                    "required": ["initiative_slug"]}
READ_SCHEMA: dict[str, Any] = {"type": "object", "properties": {"initiative_slug": SLUG_SCHEMA, "batch_id": BATCH_ID_SCHEMA},
                               "required": ["initiative_slug"]}

TOOL_DESCRIPTIONS = {
    START: "Run one tick of the Initiative's unattended lane batch and return its report with handoffs. Starts "
           "the batch after the user confirms it (asked through elicitation), and resumes it on later calls. "
           "max_parallel and final_verification are confirmed with a new batch; a resume keeps the recorded ones.",
    RETIRE: "Retire the Initiative's stale active batch (it becomes superseded) after the user confirms; refused "
            "while a child is in flight.",
    STATUS: "Read the current record of the Initiative's batch (read-only).",
    TIMELINE: "Read the events of the Initiative's batch as timeline rows, oldest first (read-only).",
}


# ---------------------------------------------------------------- outcomes


@dataclass(frozen=True)
class Outcome:
    payload: dict[str, Any]
    is_error: bool = False


def refusal(code: str, reason: str, recovery: str, **extra: Any) -> Outcome:
    state = "blocked" if code in BLOCKED else "cancelled" if code in CANCELLED else "rejected"
    return Outcome({"state": state, "reason_key": code, "reason": reason, "recovery_action": recovery, **extra},
                   is_error=True)


def _recovery_of(error: ServiceError, tool: str) -> str:
    return RECOVERY.get(error.code, "Settle the reason given, then call {tool} again.").format(tool=tool, start=START,
                                                                                               retire=RETIRE)


@dataclass(frozen=True)
class StartArgs:
    slug: str
    max_parallel: int | None
    offers: list[LaneOfferInput] | None
    instruction: InstructionInput | None
    revision: RevisionInput | None
    final_verification: list[str] | None


# ---------------------------------------------------------------- the tools, without MCP


class BatchTools:
    """What each tool does, synchronously, over the use cases; the MCP layer adds the gate."""

    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    # ------------------------------------------------------------ start_unattended_batch

    def parse_start(self, arguments: dict[str, Any]) -> StartArgs:
        """Upstream's order: lane_offers, then max_parallel (resolved against the recorded batch), then the rest."""
        slug = _slug_argument(arguments)
        offers = parse_lane_offers(arguments.get("lane_offers"))
        max_parallel = parse_max_parallel(arguments.get("max_parallel"))
        instruction = parse_lane_instruction(arguments.get("lane_instruction"))
        revision = parse_lane_revision(arguments.get("lane_revision"))
        final = parse_final_verification(arguments.get("final_verification"))
        initiative(self.deps, slug)  # the slug's own refusal, still before anything is written
        max_parallel = resolve_lane_parallel(max_parallel, offers is not None,
                                             instruction is not None or revision is not None,
                                             recorded_max_parallel(self.deps, slug))
        return StartArgs(
            slug=slug, max_parallel=max_parallel,
            offers=None if offers is None else [LaneOfferInput(task_id=o.task_id, path=o.path) for o in offers],
            instruction=None if instruction is None else InstructionInput(
                task_id=instruction.task_id, kind=instruction.kind, text=instruction.text,
                session_state=instruction.session_state),
            revision=None if revision is None else RevisionInput(task_id=revision.task_id,
                                                                 next_intent=revision.next_intent),
            final_verification=final)

    def needs_confirmation(self, args: StartArgs) -> bool:
        return authorization_needed(self.deps, args.slug)

    def confirming(self, slug: str) -> Deps:
        """The ports a confirmation runs with: in the coordinator worktree of the batch, made or reused
        (lanes_es/usecases/coordinator.py; LANES_ES_COORDINATOR=. keeps the server's checkout as upstream)."""
        from lanes_es.usecases.coordinator import for_new_batch

        return for_new_batch(self.deps, slug)

    def forget_unconfirmed(self, slug: str) -> None:
        from lanes_es.usecases.coordinator import forget_unconfirmed

        forget_unconfirmed(self.deps, slug)

    def confirmation(self, args: StartArgs, batch_id: str | None = None) -> Confirmation:
        confirmation = prepare_confirmation(self.confirming(args.slug), args.slug, BatchOptions(
            max_parallel=args.max_parallel, final_verification=args.final_verification))
        if batch_id is not None and not confirmation.resumes and batch_id.startswith(f"batch-{args.slug}-"):
            confirmation = replace(confirmation, batch_id=batch_id)  # the id the user was shown
        return confirmation

    def authorize_command(self, args: StartArgs) -> str:
        words = ["lanes-es", "--root", self.deps.root, "authorize", args.slug]
        if args.max_parallel is not None:
            words += ["--max-parallel", str(args.max_parallel)]
        for command in args.final_verification or []:
            words += ["--final-verification", command]
        return shlex.join(words + ["--yes"])

    def no_gate(self, args: StartArgs, facts: dict[str, Any], why: str) -> Outcome:
        return refusal(
            "confirmation_port_unavailable",
            f"{why}; the batch needs the user's confirmation of the facts below and nothing was written",
            f"Show the user the confirmation facts; if they confirm, run `{self.authorize_command(args)}` in the "
            f"coordinator (add --delegate-revisions only if they also delegate in-Lane Intent revisions), then call "
            f"{START} again.", confirmation=facts)

    def tick(self, args: StartArgs, confirmed: dict[str, Any] | None = None) -> Outcome:
        try:
            result = tick_batch(self.deps, args.slug, max_parallel=args.max_parallel, offers=args.offers,
                                instruction=args.instruction, revision=args.revision)
        except BatchBusy as busy:  # an outcome the host can tell from a failure: call again shortly
            return refusal("batch_busy", busy.detail, f"Another tick of this batch is running; call {START} again "
                                                      f"shortly.", outcome="busy", batch_id=busy.batch_id, holder=busy.holder,
                           waited_seconds=busy.waited)
        except StoreConflict as error:
            return refusal("store_busy", str(error), f"Let the other tick of this batch end, then call {START} again.")
        report = result.report
        extra: dict[str, Any] = {"confirmed": confirmed} if confirmed else {}
        if result.drift:
            extra["drift_repaired"] = result.drift
        if report["batch_state"] == "rejected":
            return Outcome({"state": "rejected", "reason_key": "batch_run_rejected", "reason": report.get("reason") or "",
                            "recovery_action": report["next_action"], "batch_id": result.batch_id, "report": report,
                            **extra}, is_error=True)
        return Outcome({"state": "started", "batch_id": result.batch_id, "report": report, **extra})

    def authorize_and_tick(self, args: StartArgs, confirmation: Confirmation, answer: Answer) -> Outcome:
        authorization = close_gate(self.confirming(args.slug), confirmation, answer)
        return self.tick(args, {"batch_id": authorization.batch_id, "confirmation_time": authorization.confirmation_time,
                                "delegate_revisions": answer.delegates is True})

    # ------------------------------------------------------------ retire_stale_batch

    def retire_target(self, arguments: dict[str, Any]) -> RetireTarget:
        """The batch to retire and its record's bytes; every refusal comes here, before the gate opens."""
        from lanes_es.usecases.coordinator import coordinator_of

        slug = _slug_argument(arguments)
        return read_retire_target(coordinator_of(self.deps, slug), slug)

    def retire(self, target: RetireTarget) -> Outcome:
        try:
            report, left = retire_and_remove_coordinator(self.deps, target.slug, target)
        except ServiceError as error:
            if error.code != "plan_changed":
                raise
            return refusal("plan_changed", f"batch run state {target.batch_id} changed after native confirmation; "
                                           f"nothing was retired", RECOVERY["plan_changed"].format(tool=RETIRE))
        return Outcome({"state": "retired", "batch_id": report["batch_id"], "report": report,
                        **({"coordinator": left} if left else {})})

    # ------------------------------------------------------------ reading

    def status(self, arguments: dict[str, Any]) -> Outcome:
        slug, batch_id = self._batch_of(arguments)
        batch = self.deps.store.batch(batch_id)
        valid = not authorization_needed(self.deps, slug)
        if batch is None:
            return Outcome({"state": "status", "initiative_slug": slug, "batch_id": batch_id, "batch_state": None,
                            "authorization_valid": valid, "record": None, "report": None})
        return Outcome({"state": "status", "initiative_slug": slug, "batch_id": batch_id,
                        "batch_state": batch.batch_state, "authorization_valid": valid, "record": batch.record,
                        "report": batch.report})

    def timeline(self, arguments: dict[str, Any]) -> Outcome:
        slug, batch_id = self._batch_of(arguments)
        rows = [msgspec.to_builtins(row) for row in timeline(self.deps.store.verified_events(batch_id))]
        return Outcome({"state": "timeline", "initiative_slug": slug, "batch_id": batch_id, "rows": rows})

    def _batch_of(self, arguments: dict[str, Any]) -> tuple[str, str]:
        slug = _slug_argument(arguments)
        found = initiative(self.deps, slug)
        batch_ids = found.batch_ids() if found else []
        if not batch_ids:
            raise ServiceError("batch_not_found", f"Initiative {slug} has no batch yet; call {START} with "
                                                  f"max_parallel to confirm and start one")
        wanted = arguments.get("batch_id")
        if wanted is None:
            current = found.current if found else None
            return slug, current.batch_id if current else batch_ids[-1]
        if not isinstance(wanted, str) or wanted not in batch_ids:
            raise ServiceError("batch_not_found", f"{wanted!r} is not a batch of Initiative {slug}; its batches: "
                                                  f"{', '.join(batch_ids)}")
        return slug, wanted


def _slug_argument(arguments: dict[str, Any]) -> str:
    slug = arguments.get("initiative_slug")
    if not isinstance(slug, str):
        raise InvalidInput("invalid initiative_slug: expected a string")
    return slug


# ---------------------------------------------------------------- the gate, over MCP


def confirm_schema(with_delegation: bool) -> dict[str, Any]:
    """upstream's LANE-DEL-01 form: one delegation boolean, default false, beside the confirmation itself."""
    properties: dict[str, Any] = {
        "confirm": {"type": "boolean", "title": "Confirm", "default": False,
                    "description": "Yes, I am the user and I confirm these facts."},
    }
    if with_delegation:
        properties["delegate_in_lane_revisions"] = {
            "type": "boolean", "title": "Delegate in-Lane Intent revisions", "default": False,
            "description": REVISION_DELEGATION_TEXT}
    return {"type": "object", "properties": properties, "required": ["confirm"]}


class StateSeal:
    """The multi-round `request_state` comes back from the client: it is signed so it cannot be forged."""

    def __init__(self, key: bytes | None = None) -> None:
        self.key = key or secrets.token_bytes(32)

    def seal(self, value: dict[str, Any]) -> str:
        body = base64.urlsafe_b64encode(json.dumps(value, sort_keys=True).encode()).decode()
        return f"{body}.{self._mac(body)}"

    def open(self, token: str | None) -> dict[str, Any] | None:
        if not token or "." not in token:
            return None
        body, mac = token.rsplit(".", 1)
        if not hmac.compare_digest(mac, self._mac(body)):
            return None
        try:
            value = json.loads(base64.urlsafe_b64decode(body.encode()))
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    def _mac(self, body: str) -> str:
        return hmac.new(self.key, body.encode(), hashlib.sha256).hexdigest()


class McpBatchServer:
    """The MCP layer: tool listing, argument dispatch and the user's gate (elicitation)."""

    def __init__(self, deps: Deps, seal: StateSeal | None = None) -> None:
        self.tools = BatchTools(deps)
        self.seal = seal or StateSeal()

    def tool_list(self) -> list[Any]:
        import mcp_types as types

        def tool(name: str, schema: dict[str, Any], **hints: bool) -> Any:
            return types.Tool(name=name, description=TOOL_DESCRIPTIONS[name], input_schema=schema,
                              annotations=types.ToolAnnotations(**hints))

        return [tool(START, START_SCHEMA, read_only_hint=False, destructive_hint=False),
                tool(RETIRE, SLUG_ONLY_SCHEMA, read_only_hint=False, destructive_hint=True),
                tool(STATUS, READ_SCHEMA, read_only_hint=True),
                tool(TIMELINE, READ_SCHEMA, read_only_hint=True)]

    async def list_tools(self, ctx: Any, params: Any) -> Any:
        import mcp_types as types

        return types.ListToolsResult(tools=self.tool_list())

    async def call_tool(self, ctx: Any, params: Any) -> Any:
        name, arguments = params.name, params.arguments
        try:
            if not isinstance(arguments, dict):
                raise InvalidInput(f"invalid arguments: {name} takes an object")
            if name == START:
                outcome = await self.start(ctx, params, arguments)
            elif name == RETIRE:
                outcome = await self.retire(ctx, params, arguments)
            elif name == STATUS:
                outcome = self.tools.status(arguments)
            elif name == TIMELINE:
                outcome = self.tools.timeline(arguments)
            else:
                outcome = refusal("unknown_tool", f"there is no tool {name!r}",
                                  f"Call one of {START}, {RETIRE}, {STATUS}, {TIMELINE}.")
        except InvalidInput as error:
            outcome = refusal("invalid_input", str(error), CORRECT_ARGUMENTS.format(tool=name))
        except ServiceError as error:
            outcome = refusal(error.code, error.detail, _recovery_of(error, name))
        except StoreError as error:  # the store cannot be used (its path, its server, its grants): the user fixes it
            outcome = refusal("store_unavailable", str(error), STORE_RECOVERY.format(tool=name))
        except Refusal as error:
            outcome = refusal("refused", str(error), "Settle the reason given, then call {tool} again.".format(
                tool=name))
        except Exception as error:  # noqa: BLE001 - the host gets what happened instead of a dropped call
            # a PostgreSQL role without the grants the call needs, or a server that ended the connection
            refused = privilege_refusal(error) or outage_refusal(error)
            outcome = (refusal("store_unavailable", str(refused), STORE_RECOVERY.format(tool=name)) if refused
                       else refusal("internal_error", f"{type(error).__name__}: {error}",
                                    "Report this; the log keeps every step already taken, so calling again is safe."))
        return outcome if not isinstance(outcome, Outcome) else _result(outcome)

    # ------------------------------------------------------------ gated tools

    async def start(self, ctx: Any, params: Any, arguments: dict[str, Any]) -> Outcome | Any:
        args = self.tools.parse_start(arguments)
        if not self.tools.needs_confirmation(args):
            return self.tools.tick(args)
        asked = self.answered_round(params, CONFIRM_KEY, START)
        confirmation = self.tools.confirmation(args, asked["batch_id"] if asked else None)
        facts = confirmation.facts()
        # What the user is asked about; in the round that brings the answer, what they were asked about.
        seen = asked if asked is not None else gate_facts(confirmation)
        answer = await self.ask(ctx, params, CONFIRM_KEY, confirmation_text(facts), confirm_schema(True), seen)
        if isinstance(answer, str):
            self.tools.forget_unconfirmed(args.slug)
            return self.tools.no_gate(args, facts, answer)
        if not isinstance(answer, Answer):
            return answer  # the input-required round: the client asks the user and calls again
        if not answer.confirmed:
            self.tools.forget_unconfirmed(args.slug)
            return _declined(answer, START)
        # After the gate: the facts the user saw must still be the facts (upstream re-checks drift), else
        # refused as upstream refuses after its gate, never asked again.
        again = self.tools.confirmation(args, seen["batch_id"])
        moved = moved_since_gate(seen, again, self.tools.deps.root)
        if moved is None and not self.tools.needs_confirmation(args):
            moved = ("plan_changed", f"Initiative {args.slug} was confirmed by another call after native "
                                     f"confirmation; nothing was recorded")
        if moved is not None:
            self.tools.forget_unconfirmed(args.slug)
            return refusal(moved[0], moved[1], RECOVERY[moved[0]].format(tool=START))
        return self.tools.authorize_and_tick(args, again, answer)

    async def retire(self, ctx: Any, params: Any, arguments: dict[str, Any]) -> Outcome | Any:
        slug = _slug_argument(arguments)
        seen = self.answered_round(params, RETIRE_KEY, RETIRE)
        if seen is None or seen.get("initiative_slug") != slug:  # every refusal comes before the gate opens
            target = self.tools.retire_target(arguments)
            seen = {"tool": RETIRE, "initiative_slug": slug, "batch_id": target.batch_id,
                    "record": target.record_digest}
        batch_id = seen["batch_id"]
        message = (f"Retire batch {batch_id} of Initiative {slug}? It becomes superseded: it grants no more handoffs "
                   f"or child delivery, and its record, commits and Lanes are kept.")
        answer = await self.ask(ctx, params, RETIRE_KEY, message, confirm_schema(False), seen)
        if isinstance(answer, str):
            return refusal("confirmation_port_unavailable", f"{answer}; nothing was retired",
                           f"If the user confirms, run `{shlex.join(['lanes-es', '--root', self.tools.deps.root, 'retire', slug, '--yes'])}` "
                           f"in the coordinator.", batch_id=batch_id)
        if not isinstance(answer, Answer):
            return answer
        if not answer.confirmed:
            return _declined(answer, RETIRE)
        # A compare-and-swap on the record the user was asked about, carried (sealed) across the rounds.
        return self.tools.retire(RetireTarget(slug=slug, batch_id=batch_id, record_digest=seen["record"]))

    def answered_round(self, params: Any, key: str, tool: str) -> dict[str, Any] | None:
        """The state sealed in the round that asked the user, when this call brings the answer to `key` for
        `tool` (a 2026-07-28 client's second round); None otherwise."""
        if (getattr(params, "input_responses", None) or {}).get(key) is None:
            return None
        sealed = self.seal.open(getattr(params, "request_state", None))
        return sealed if sealed is not None and sealed.get("tool") == tool else None

    async def ask(self, ctx: Any, params: Any, key: str, message: str, schema: dict[str, Any],
                  state: dict[str, Any]) -> Answer | str | Any:
        """The user's answer; or, on a 2026-07-28 connection, the input-required result that asks for it;
        or a string saying why the client cannot ask."""
        import mcp_types as types
        from mcp.shared.exceptions import MCPError
        from mcp_types.version import is_version_at_least

        capabilities = ctx.session.client_capabilities
        elicitation = capabilities.elicitation if capabilities is not None else None
        if elicitation is None or (elicitation.form is None and elicitation.url is not None):
            return "this MCP client cannot put a confirmation to the user (it declares no form elicitation)"
        request = types.ElicitRequestFormParams(message=message, requested_schema=schema)
        if is_version_at_least(ctx.protocol_version, "2026-07-28"):
            echoed = self.seal.open(getattr(params, "request_state", None))
            response = (getattr(params, "input_responses", None) or {}).get(key)
            if response is not None and echoed == state:
                return Answer(getattr(response, "action", "cancel"), dict(getattr(response, "content", None) or {}))
            return types.InputRequiredResult(input_requests={key: types.ElicitRequest(params=request)},
                                             request_state=self.seal.seal(state))
        try:
            result = await ctx.session.elicit_form(message=message, requested_schema=schema,
                                                   related_request_id=ctx.request_id)
        except MCPError as error:
            return f"the MCP client could not put the confirmation to the user ({error.error.message})"
        return Answer(result.action, dict(result.content or {}))


def gate_facts(confirmation: Confirmation) -> dict[str, Any]:
    """What start_unattended_batch's gate puts to the user, as it is sealed across the rounds and compared after
    the answer: the batch, the digest of every fact shown, and the plan and HEAD apart (their own refusals)."""
    return {"tool": START, "batch_id": confirmation.batch_id, "facts": facts_digest(confirmation.facts()),
            "plan": confirmation.plan_digest, "head": confirmation.seen_head or confirmation.base_head}


def moved_since_gate(seen: dict[str, Any], now: Confirmation, root: str) -> tuple[str, str] | None:
    """upstream's refusal after its gate when what the user confirmed moved meanwhile: (`plan_changed` or
    `head_moved`, the reason), or None when the facts are the ones the user saw."""
    if now.plan_digest != seen.get("plan"):
        return "plan_changed", (f"the batch plan of Initiative {now.slug} changed after native confirmation (it is "
                                f"now {now.plan_digest}, the user confirmed {seen.get('plan')}); nothing was recorded")
    head = now.seen_head or now.base_head
    if head != seen.get("head"):
        return "head_moved", (f"HEAD of {root} moved after native confirmation (from {seen.get('head')} to {head}); "
                              f"nothing was recorded")
    if facts_digest(now.facts()) != seen.get("facts"):
        return "plan_changed", (f"the confirmation facts of Initiative {now.slug} changed after native confirmation; "
                                f"nothing was recorded")
    return None


def _declined(answer: Answer, tool: str) -> Outcome:
    if answer.action == "cancel":
        return refusal("confirmation_cancelled", "the user cancelled the confirmation; nothing was written",
                       f"Call {tool} again when the user is ready to decide.")
    return refusal("confirmation_declined", "the user did not confirm; nothing was written",
                   f"Correct what the user objected to, then call {tool} again.")


def _result(outcome: Outcome) -> Any:
    import mcp_types as types

    text = json.dumps(outcome.payload, indent=2, ensure_ascii=False)
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                structured_content=outcome.payload, is_error=outcome.is_error)


# ---------------------------------------------------------------- serving


def build_server(deps: Deps) -> Any:
    from mcp.server.lowlevel import Server

    batch_server = McpBatchServer(deps)
    return Server(SERVER_NAME, version=_version(), instructions=INSTRUCTIONS,
                  on_list_tools=batch_server.list_tools, on_call_tool=batch_server.call_tool)


async def serve_stdio(deps: Deps) -> None:
    from mcp.server.stdio import stdio_server

    server = build_server(deps)
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lanes-es")
    except PackageNotFoundError:
        return "0"


MCP_DESCRIPTION = """\
Serve the batch tools to an agent host over MCP on stdio (the host starts this command):

  start_unattended_batch  one tick of the Initiative's lane batch (confirms it with the user first)
  retire_stale_batch      retire the Initiative's stale active batch (superseded)
  batch_status            the batch's current record (read-only)
  batch_timeline          the batch's events as timeline rows (read-only)

The coordinator checkout is --root (default: the current directory). A host configuration:

  {"mcpServers": {"lanes-es": {"command": "lanes-es", "args": ["--root", "/path/to/repo", "mcp"]}}}

The user confirms a batch through MCP elicitation; a host without it gets the facts back
with the `lanes-es authorize` command that confirms them. Needs the MCP Python SDK 2.x:
pip install 'lanes-es[mcp]'.
"""


def register(commands: Any) -> None:
    command = commands.add_parser("mcp", help="serve the batch tools to an agent host (MCP over stdio)",
                                  description=MCP_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    command.set_defaults(func=_serve)


def _serve(args: argparse.Namespace) -> int:
    try:  # anyio comes with the SDK: without the extra, every one of these is missing
        import anyio
        from mcp.server.lowlevel import Server  # noqa: F401 - only to say clearly what is missing
        import mcp_types  # noqa: F401
    except ImportError:
        raise ServiceError("mcp_sdk_missing", "the MCP Python SDK 2.x is not installed; install it with "
                                              "`pip install 'lanes-es[mcp]'` (or `pip install 'mcp>=2'`)") from None
    from lanes_es.cli.main import deps_of

    anyio.run(serve_stdio, deps_of(args))
    return 0


__all__ = ["register", "build_server", "serve_stdio", "BatchTools", "McpBatchServer", "START_SCHEMA", "StateSeal"]
