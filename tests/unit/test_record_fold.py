"""The fold's dispatch on an event's exact class (record.apply_event, report.report_after, the
projections' fold_documents) finds what an isinstance test would only while no event class
derives from another: a subclass of BatchSettled would make no report, silently."""

from __future__ import annotations

import inspect

from lanes_es.domain import events as ev


def test_no_event_class_derives_from_another():
    classes = [cls for cls in vars(ev).values()
               if inspect.isclass(cls) and issubclass(cls, ev.Event) and cls is not ev.Event]
    assert len(classes) > 20  # the reader sees the event classes at all
    derived = [f"{cls.__name__} derives from {base.__name__}"
               for cls in classes for base in classes if cls is not base and issubclass(cls, base)]
    assert derived == []
