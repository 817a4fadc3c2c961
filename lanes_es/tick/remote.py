"""The attempts an earlier coordinator of this batch sent to a Ray cluster and never saw end.

A coordinator killed while its checks ran on the cluster leaves them open in the log (dispatched, with
neither end nor loss). Before this tick sends anything, each is settled on its node: collected when it
finished, cancelled when it still runs, lost when its node no longer knows it, and each outcome is
recorded. Their results are not used (only an attempt the current tick waits for counts): the
candidates they checked are this tick's to build and check again.
"""

from __future__ import annotations

from lanes_es.tick.context import TickContext


def settle_open_attempts(ctx: TickContext) -> None:
    journal = ctx.ports.remote
    # An Executor attempt is not a tick's: the autopilot that sent it holds it, or the next one settles it
    # (lanes_es/steward/attempts.py)
    left = ctx.live.remote_attempts.open_of("check", "qa")
    if journal is None or not left:
        return
    journal.settle_open(left)
    ctx.persist()
