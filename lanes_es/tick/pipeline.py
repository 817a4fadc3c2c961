"""One tick of a lane batch (upstream's `runLaneBatch`, 5.2.0): the steps of docs/upstream.md#the-steps-of-a-tick, in order.

Each step is a module of its own. A step reads facts through the ports, decides with the
domain, and records each decision as an event on the `LaneBatch`, persisting after each
decision as upstream persists after each step: a crash between two steps leaves a log from
which the next tick converges. Only kernel and git facts move a child; nothing is inferred from text.
"""

from __future__ import annotations

from typing import Any

from lanes_es.domain.batch import LaneBatch
from lanes_es.tick import admit, commit, complete, inputs, integrate, observe, reconcile, remote, start, tracker
from lanes_es.tick.context import TickContext, TickFinished, TickOutcome
from lanes_es.tick_input import Persist, TickInput, TickPorts


def run_lane_batch(tick: TickInput, batch: LaneBatch | None, ports: TickPorts, persist: Persist) -> TickOutcome:
    """One tick. The caller holds the batch lock and passes the batch as the log has it (or None)."""
    ctx = TickContext(tick=tick, ports=ports, persist_port=persist, batch=batch)
    refused = start.check_parallel_and_plan(ctx)                            # steps 1-3
    if refused is not None:
        return refused
    try:
        early = start.resume_recorded(ctx) if batch is not None else start.start_new(ctx)   # steps 4-5
        if early is not None:
            return early
        return TickOutcome(advance(ctx), ctx.batch)
    except TickFinished as finished:
        return TickOutcome(finished.report, ctx.batch)


def advance(ctx: TickContext) -> dict[str, Any]:
    """Steps 6-16 and 1-4 of a batch that runs (a new one, or a recorded one that may move)."""
    new_batch = ctx.live.batch_state == "prepared"
    remote.settle_open_attempts(ctx)                        # an earlier coordinator's attempts on a cluster
    reconcile.replace_grant(ctx, new_batch)                 # 6  a fresh confirmation's delegation answer
    if not new_batch:
        reconcile.restore_leaks(ctx)                        # 7  Lane writes leaked into the coordinator
    reconcile.start_running(ctx)                            # 8  prepared -> running
    reconcile.adopt_missed_integrations(ctx)                # 9
    reconcile.record_releases(ctx)                          # 10
    reconcile.check_lineage(ctx)                            # 11
    reconcile.rehydrate_consumption(ctx)                    # 12
    reconcile.persist_resumed_park(ctx)                     # 13
    inputs.decide_instruction(ctx)                          # 14
    inputs.decide_revision(ctx)                             # 15
    observe.observe_lanes(ctx)                              # step 1: observe, enroll, QA
    commit.commit_settled(ctx)                              # step 2a: lane commits
    integrate.integrate_committed(ctx)                      # step 2b: guarded integration
    tracker.close_integrated_issues(ctx)                    # 16
    admit.admit_offers(ctx)                                 # step 3: admission
    return complete.settle_or_report(ctx)                   # step 4: settle or report
