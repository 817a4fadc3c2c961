"""The use cases: what the command line, the MCP server and the autopilot call, one module each.

In the shape of cosmicpython's `service_layer/handlers.py`: each use case is a short function
given its ports (`Deps`, wired once by the composition root, lanes_es/bootstrap.py); it loads
the aggregates, decides through the domain or the tick, saves, and materializes the projections.

  plan.py          the batch plan as the coordinator reads it now (writes nothing)
  confirmation.py  the facts a literal user confirms (`BatchOptions` in, `Confirmation` out)
  authorize.py     record the user's yes, decided again on the Initiative as it now stands
  gate.py          the one confirmation gate the CLI, the MCP server and the autopilot adapt
  tick.py          one tick of a batch under its lock
  retire.py        the active batch becomes superseded, compare-and-swap on its record
  rebuild.py       the projections recomputed from the log (or checked)
  status.py        where a batch stands, read-only

Shared pieces: `deps.py` (the ports), `load.py` (the aggregates), `lock.py` (the batch lock and
its busy outcome), `save.py` (save, materialize, repair drift, anchor), `stats.py` (LANES_ES_STATS).

Nothing is imported here, so that `status` does not pay for the tick's modules.
"""
