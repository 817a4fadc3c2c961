"""The named Executor adapters without a process: their argv, how they read their agent's output, the
prompt for each obligation, the environment and the argv the log keeps.

The output lines are in each agent's documented format (the shapes its own SDK parses, the sample
lines of its docs); the fake CLIs under tests/fakes/agents print the same, and the integration
tests read them through a real attempt.
"""

from __future__ import annotations

import json

import pytest

from lanes_es.domain.events import AttemptLimits, ExecutorUsage
from lanes_es.executors import ADAPTER_NAMES, agent_named
from lanes_es.executors.environment import argv_for_the_record, executor_environment
from lanes_es.executors.prompt import Assignment, build_prompt, prompt_digest
from tests.gitfixtures import descriptor, intent_json

LANE = "/work/lanes/greet"
LIMITS = AttemptLimits(timeout_seconds=600)


def feed(name: str, lines: list[dict]) -> ExecutorUsage:
    reader = agent_named(name).reader()
    for line in lines:
        reader.feed(json.dumps(line))
    return reader.usage()


# ---------------------------------------------------------------- argv


def test_each_name_is_an_adapter_and_any_other_is_a_command():
    assert [agent_named(name).name for name in ADAPTER_NAMES] == list(ADAPTER_NAMES)
    assert agent_named("my-agent") is None and agent_named("claude") is None


def test_claude_code_runs_print_mode_with_the_prompt_right_after_p_and_its_sandbox_on():
    argv = agent_named("claude-code").argv("claude", LANE, "PROMPT", LIMITS)
    assert argv[:3] == ["claude", "-p", "PROMPT"]  # before --allowedTools, whose list would take it
    assert argv[3:] == ["--output-format", "stream-json", "--verbose", "--permission-mode", "acceptEdits",
                        "--allowedTools", "Read,Glob,Grep,Edit,Write", "--settings", argv[-1]]
    assert json.loads(argv[-1]) == {"sandbox": {"enabled": True, "failIfUnavailable": True,
                                                "allowUnsandboxedCommands": False, "autoAllowBashIfSandboxed": True}}
    assert "--add-dir" not in argv


def test_claude_code_takes_the_remaining_cost_as_its_own_budget():
    argv = agent_named("claude-code").argv("claude", LANE, "P", AttemptLimits(timeout_seconds=60, cost_usd=1.25))
    assert argv[-2:] == ["--max-budget-usd", "1.25"]
    tiny = agent_named("claude-code").argv("claude", LANE, "P", AttemptLimits(timeout_seconds=60, cost_usd=0.00005))
    assert tiny[-1] == "0.0001"  # never an exponent


def test_codex_runs_exec_in_the_lane_with_only_the_lane_writable():
    argv = agent_named("codex").argv("/opt/bin/codex", LANE, "PROMPT", AttemptLimits(timeout_seconds=60, cost_usd=2.0))
    assert argv == ["/opt/bin/codex", "exec", "--json", "--sandbox", "workspace-write", "-C", LANE,
                    "-c", "sandbox_workspace_write.exclude_slash_tmp=true",
                    "-c", "sandbox_workspace_write.exclude_tmpdir_env_var=true", "PROMPT"]
    assert agent_named("codex").reports_cost is False


def test_opencode_runs_one_message_with_outside_paths_denied_by_its_inline_config():
    agent = agent_named("opencode")
    assert agent.argv("opencode", LANE, "PROMPT", LIMITS) == [
        "opencode", "run", "--format", "json", "--dir", LANE, "--agent", "build", "PROMPT"]
    config = json.loads(agent.environment(LANE)["OPENCODE_CONFIG_CONTENT"])
    assert config == {"permission": {"external_directory": "deny"},
                      "agent": {"build": {"permission": {"external_directory": "deny"}}}}


# ---------------------------------------------------------------- reading each agent's output


def test_claude_code_usage_comes_from_its_messages_as_they_go_and_its_result_at_the_end():
    session = "fdf2d90a-fd9e-4736-ae35-806edd13643f"
    init = {"type": "system", "subtype": "init", "session_id": session, "cwd": LANE, "tools": []}
    usage = {"input_tokens": 3, "output_tokens": 24, "cache_read_input_tokens": 20012, "cache_creation_input_tokens": 10}
    message = {"type": "assistant", "session_id": session,
               "message": {"id": "msg_1", "model": "m", "content": [], "usage": usage}}
    as_it_goes = feed("claude-code", [init, message, message])  # one API message may come as two lines
    assert (as_it_goes.session_id, as_it_goes.tokens_in, as_it_goes.tokens_out) == (session, 20025, 24)
    assert as_it_goes.cost_usd is None
    result = {"type": "result", "subtype": "success", "is_error": False, "duration_ms": 3000, "duration_api_ms": 2000,
              "num_turns": 1, "session_id": session, "total_cost_usd": 0.0106, "usage": usage, "result": "Hello",
              "permission_denials": [{"tool_name": "WebFetch", "tool_use_id": "toolu_1", "tool_input": {}}]}
    final = feed("claude-code", [init, message, result, "not json at all", {"type": "result", "usage": "bogus"}])
    assert final == ExecutorUsage(session_id=session, tokens_in=20025, tokens_out=24, cost_usd=0.0106,
                                  denied_tools=["WebFetch"], agent_error=False, error=None)


def test_claude_code_reports_a_budget_stop_and_its_own_errors():
    stopped = feed("claude-code", [{"type": "result", "subtype": "error_max_budget_usd", "is_error": False,
                                    "session_id": "s", "total_cost_usd": 0.0002, "num_turns": 1,
                                    "usage": {"input_tokens": 100, "output_tokens": 50}}])
    assert (stopped.agent_error, stopped.error, stopped.cost_usd) == (False, "error_max_budget_usd", 0.0002)
    failed = feed("claude-code", [{"type": "result", "subtype": "error_during_execution", "is_error": True,
                                   "session_id": "s", "errors": ["API Error: 401"], "usage": {}}])
    assert (failed.agent_error, failed.error) == (True, "error_during_execution: API Error: 401")


def test_codex_usage_is_the_sum_of_its_turns_and_a_declined_command_is_a_denied_tool_call():
    lines = [{"type": "thread.started", "thread_id": "0199a213-81c0-7800-8aa1-bbab2a035a53"}, {"type": "turn.started"},
             {"type": "item.completed", "item": {"id": "item_1", "type": "command_execution", "command": "bash -lc ls",
                                                 "aggregated_output": "", "exit_code": 0, "status": "completed"}},
             {"type": "item.completed", "item": {"id": "item_2", "type": "command_execution", "command": "curl x",
                                                 "aggregated_output": "", "exit_code": None, "status": "declined"}},
             {"type": "turn.completed", "usage": {"input_tokens": 24763, "cached_input_tokens": 24448,
                                                  "output_tokens": 122}},
             {"type": "turn.completed", "usage": {"input_tokens": 10, "cached_input_tokens": 0, "output_tokens": 5}}]
    usage = feed("codex", lines)
    assert usage == ExecutorUsage(session_id="0199a213-81c0-7800-8aa1-bbab2a035a53", tokens_in=24773, tokens_out=127,
                                  denied_tools=["command: curl x"])
    failed = feed("codex", [{"type": "error", "message": "You've hit your usage limit"},
                            {"type": "turn.failed", "error": {"message": "stream disconnected"}}])
    assert (failed.agent_error, failed.error, failed.cost_usd) == (True, "stream disconnected", None)


def test_opencode_usage_adds_up_its_steps_and_done_lists_the_rejected_requests():
    def step(cost: float, read: int) -> dict:
        return {"type": "step_finish", "timestamp": 1, "sessionID": "ses_1",
                "part": {"id": "p", "sessionID": "ses_1", "messageID": "m", "type": "step-finish", "reason": "stop",
                         "cost": cost, "tokens": {"input": 100, "output": 20, "reasoning": 5,
                                                  "cache": {"read": read, "write": 1}}}}
    usage = feed("opencode", [{"type": "step_start", "timestamp": 1, "sessionID": "ses_1", "part": {}},
                              step(0.01, 1000), step(0.02, 0),
                              {"type": "done", "timestamp": 1, "sessionID": "ses_1", "reason": "idle",
                               "rejected": ["external_directory"]}])
    assert usage == ExecutorUsage(session_id="ses_1", tokens_in=1202, tokens_out=50, cost_usd=0.03,
                                  denied_tools=["external_directory"])
    failed = feed("opencode", [{"type": "error", "timestamp": 1, "sessionID": "ses_2",
                                "error": {"name": "ProviderAuthError", "data": {"message": "no key"}}}])
    assert (failed.session_id, failed.agent_error, failed.error) == ("ses_2", True, "no key")


@pytest.mark.parametrize("name", ADAPTER_NAMES)
def test_a_line_of_a_known_type_in_another_shape_changes_nothing(name):
    hostile = [{"type": "result", "usage": {"input_tokens": -5}}, {"type": "turn.completed", "usage": {"input_tokens": "x"}},
               {"type": "step_finish", "part": {"tokens": {"input": True}, "cost": "free"}}, [1, 2], "{"]
    assert feed(name, hostile) == ExecutorUsage()


# ---------------------------------------------------------------- the prompt


def assignment(**changes) -> Assignment:
    intent = dict(intent_json("greet", ["src/greet.py", "tests/"],
                                    verification=descriptor(["-m", "pytest", "-q", "tests/test_greet.py"])))
    facts = {"task_id": "greet", "lane": LANE, "branch": "imm-lane/demo/greet", "intent": intent, "attempt": 1,
             "lanes_es": "/venv/bin/python -m lanes_es.cli.main"}
    return Assignment(**{**facts, **changes})


def test_the_first_delivery_prompt_holds_the_goal_scope_checks_risk_and_rules():
    prompt = build_prompt(assignment())
    assert assignment().obligation == "first_delivery"
    for expected in ("task greet", LANE, "imm-lane/demo/greet", "Goal:", "- src/greet.py", "- tests/",
                     "python3 -m pytest -q tests/test_greet.py", "routine", "This attempt (1): first delivery",
                     "Do not commit", "/venv/bin/python -m lanes_es.cli.main task check",
                     "Do not run `/venv/bin/python -m lanes_es.cli.main task submit`", "the checks decide"):
        assert expected in prompt, expected
    assert "failed the coordinator's QA" not in prompt and "coordinator sent you" not in prompt


def test_a_rework_prompt_quotes_each_failed_check_with_its_output_tail():
    findings = [("greet:A1", "python3 exited with code 1: E AssertionError: 'Hi' != 'Hello' 1 failed in 0.02s")]
    rework = assignment(attempt=2, findings=findings)
    prompt = build_prompt(rework)
    assert rework.obligation == "rework"
    assert "This attempt (2): rework" in prompt
    assert "> greet:A1: python3 exited with code 1: E AssertionError: 'Hi' != 'Hello' 1 failed in 0.02s" in prompt
    assert "do not change the checks" in prompt


def test_a_correction_prompt_quotes_the_coordinators_text_before_the_findings():
    corrected = assignment(attempt=3, findings=[("greet:A1", "exited with code 1")],
                           interventions=[("correction", "Use an f-string, and keep greet() pure.\nNo printing.")])
    prompt = build_prompt(corrected)
    assert corrected.obligation == "correction"
    assert "> correction: Use an f-string, and keep greet() pure.\n> No printing." in prompt
    assert prompt.index("correction: Use an f-string") < prompt.index("greet:A1: exited with code 1")


def test_a_retry_prompt_says_the_lane_keeps_what_the_last_attempt_left():
    assert "Attempt 1 ended without delivering" in build_prompt(assignment(attempt=2))


def test_lane_text_is_quoted_and_cut_so_the_prompt_stays_one_argument():
    huge = assignment(findings=[(f"greet:A{i}", "x" * 10_000) for i in range(50)],
                      interventions=[("correction", "y" * 50_000)])
    prompt = build_prompt(huge)
    assert len(prompt) <= 100_000 and prompt.count("> greet:A") == 20
    assert prompt_digest(prompt).startswith("sha256:") and len(prompt_digest(prompt)) == 71


# ---------------------------------------------------------------- environment, and the argv the log keeps


def test_the_agent_gets_the_users_environment_and_none_of_the_coordinators():
    user = {"ANTHROPIC_API_KEY": "sk-ant-1", "OPENAI_API_KEY": "sk-2", "HOME": "/home/u", "PATH": "/bin",
            "LANES_ES_STORE": "postgresql://secret@db/x", "LANES_ES_SIGNING_KEY": "/keys/signing", "LANES_ES_STATS": "/s",
            "LANES_ES_TASK_ID": "stale", "LANES_ES_EXECUTOR_HINT": "{}", "GIT_DIR": "/repo/.git",
            "GIT_INDEX_FILE": "/repo/.git/index", "GIT_AUTHOR_NAME": "U"}
    env = executor_environment(user, {"LANES_ES_TASK_ID": "greet"}, {"OPENCODE_CONFIG_CONTENT": "{}"})
    assert env == {"ANTHROPIC_API_KEY": "sk-ant-1", "OPENAI_API_KEY": "sk-2", "HOME": "/home/u", "PATH": "/bin",
                   "GIT_AUTHOR_NAME": "U", "LANES_ES_EXECUTOR_HINT": "{}", "LANES_ES_TASK_ID": "greet",
                   "OPENCODE_CONFIG_CONTENT": "{}"}


def test_the_logged_argv_has_the_prompts_digest_and_no_secret():
    argv = ["my-agent", "--api-key", "sk-123", "--token=abc", "OPENAI_API_KEY=sk-4", "--model", "m", "do the task"]
    assert argv_for_the_record(argv, "do the task", "sha256:ab") == [
        "my-agent", "--api-key", "***", "--token=***", "OPENAI_API_KEY=***", "--model", "m", "<prompt sha256:ab>"]
