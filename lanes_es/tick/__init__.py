"""The tick: a pipeline of named steps (`pipeline.py`), one module per step of docs/upstream.md#the-steps-of-a-tick."""

from lanes_es.tick.complete import lane_rejection_report
from lanes_es.tick.context import (
    PlanMismatch, TickContext, TickFinished, TickOutcome, draft_record, lane_unreadable_reason, refusal_report,
)
from lanes_es.tick.inputs import decide_lane_instruction
from lanes_es.tick.pipeline import run_lane_batch

__all__ = ["PlanMismatch", "TickContext", "TickFinished", "TickOutcome", "decide_lane_instruction", "draft_record",
           "lane_rejection_report", "lane_unreadable_reason", "refusal_report", "run_lane_batch"]
