"""The steward: the autopilot playing Parent and Lane Steward for one Initiative's batch.

It runs under the Initiative's current authorization (where there is none it shows the
confirmation facts and asks, or takes --yes), then loops (`loop.py`):

  tick -> for each release handoff: remove the Lane, only when it is clean (`lanes.py`)
       -> for each provision handoff: make the Lane (git worktree add) and offer it on the next tick
       -> for each executor handoff: start the Executor command in the Lane (`executors.py`)
       -> when nothing else is to be done: wait for an Executor to exit, and tick again

It stops with a summary (`summary.py`) when the batch completes, parks (needs_human), runs out
of budget, fails, is rejected, asks for a coordinator's correction, or can make no more progress.
The runtime never makes or removes a worktree; only this package does (docs/architecture.md).

Nothing is imported here, so that a command needing one module does not pay for the others.
"""
