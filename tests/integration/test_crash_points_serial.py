"""Convergence after a crash at any point (issue 3), in the serial integration mode, on SQLite and
PostgreSQL: tests/integration/crash_points.py says what runs and which crash points."""

from tests.integration.crash_points import crash_point_tests

template, reference, test_the_uninterrupted_run_settles_as_designed, test_a_crash_at_any_call_converges_to_the_same_end = \
    crash_point_tests("serial")
