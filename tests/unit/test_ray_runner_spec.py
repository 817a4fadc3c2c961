"""The runner a user names (`--runner`, LANES_ES_RUNNER), and the refusals before any connection to a Ray
cluster: the extra missing, token authentication off, no token."""

from __future__ import annotations

import sys

import pytest

from lanes_es.adapters.ray_cluster import RayUnavailable, ray_module, require_token_auth
from lanes_es.domain.runner import InvalidRunner, is_ray, parse_runner, ray_address
from lanes_es.errors import Refusal


@pytest.mark.parametrize("text, canonical", [
    ("local", "local"),
    (" local ", "local"),
    ("ray://10.0.0.5:10001", "ray://10.0.0.5:10001"),
    ("ray://Head.Example:0010001", "ray://head.example:10001"),
    ("ray://[fd00::5]:10001", "ray://[fd00::5]:10001"),
])
def test_a_runner_is_local_or_a_ray_client_address(text: str, canonical: str) -> None:
    assert parse_runner(text) == canonical
    assert is_ray(canonical) == canonical.startswith("ray://")


@pytest.mark.parametrize("text, says", [
    ("", "neither"),
    ("ray", "neither"),
    ("http://10.0.0.5:10001", "neither"),
    ("ray://10.0.0.5", "names no host"),
    ("ray://:10001", "names no host"),
    ("ray://a b:10001", "names no host"),
    ("ray://10.0.0.5:0", "no port"),
    ("ray://10.0.0.5:65536", "no port"),
    ("ray://10.0.0.5:x1", "no port"),
])
def test_anything_else_is_refused_saying_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(InvalidRunner, match=says):
        parse_runner(text)


def test_the_address_is_what_ray_client_dials() -> None:
    assert ray_address(parse_runner("ray://10.0.0.5:10001")) == "10.0.0.5:10001"


def test_without_the_extra_the_refusal_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(RayUnavailable, match=r"pip install 'lanes-es\[ray\]'") as refused:
        ray_module()
    assert isinstance(refused.value, Refusal)


def test_token_authentication_is_required(tmp_path) -> None:
    home = {"HOME": str(tmp_path)}
    with pytest.raises(RayUnavailable, match="RAY_AUTH_MODE is 'disabled'"):
        require_token_auth({**home, "RAY_AUTH_MODE": "disabled", "RAY_AUTH_TOKEN": "x" * 32})
    with pytest.raises(RayUnavailable, match="no token is set.*ray get-auth-token"):
        require_token_auth(dict(home))
    with pytest.raises(RayUnavailable, match="RAY_AUTH_TOKEN_PATH .* is not a readable file"):
        require_token_auth({**home, "RAY_AUTH_TOKEN_PATH": str(tmp_path / "missing")})


def test_a_token_from_the_environment_a_file_or_rays_default_path_turns_token_mode_on(tmp_path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("t" * 32)
    (tmp_path / ".ray").mkdir()
    for env in ({"RAY_AUTH_TOKEN": "t" * 32}, {"RAY_AUTH_TOKEN_PATH": str(token_file)}):
        env = {**env, "HOME": str(tmp_path / "elsewhere")}
        require_token_auth(env)
        assert env["RAY_AUTH_MODE"] == "token"
    (tmp_path / ".ray" / "auth_token").write_text("t" * 32)
    env = {"HOME": str(tmp_path)}
    require_token_auth(env)
    assert env["RAY_AUTH_MODE"] == "token"


def test_the_log_folds_the_attempts_sent_to_a_cluster_open_until_ended_or_lost() -> None:
    from lanes_es.domain import events as ev
    from lanes_es.domain.remote_attempts import RemoteAttempts

    def sent(attempt_id: str) -> ev.RemoteAttemptDispatched:
        return ev.RemoteAttemptDispatched(originator_id="b", originator_version=1, timestamp=None, at="t",  # type: ignore[arg-type]
                                          attempt_id=attempt_id, kind="check", task_id="t0", node="n1", tree="x")

    folded = RemoteAttempts()
    for event in (sent("a1"), sent("a2"), sent("a3"),
                  ev.RemoteAttemptEnded(originator_id="b", originator_version=4, timestamp=None, at="t",  # type: ignore[arg-type]
                                        attempt_id="a1", node="n1", outcome="passed"),
                  ev.RemoteAttemptLost(originator_id="b", originator_version=5, timestamp=None, at="t",  # type: ignore[arg-type]
                                       attempt_id="a2", node="n1", detail="RayActorError")):
        folded.fold(event)
    assert list(folded.open) == ["a3"] and (folded.dispatched, folded.lost) == (3, 1)


class _Cluster:
    """RayCheckRunner's surface as RayChecks uses it: answers scripted per task."""

    runner = "ray://10.0.0.5:10001"

    def __init__(self, answers: dict[str, object]) -> None:
        self.answers = answers
        self.asked: list[tuple[str, str, bool]] = []

    def run_attempts(self, tree, task_id, intent, cancel=None, work="check"):  # noqa: ANN001, ANN201
        return self.answers[task_id]

    def collect(self, node: str, attempt_id: str, cancel: bool = False):  # noqa: ANN201
        self.asked.append((node, attempt_id, cancel))
        return self.answers[attempt_id]


def _checks(answers: dict[str, object]):  # noqa: ANN202
    from lanes_es.adapters.ray_checks import RayChecks

    checks = RayChecks.__new__(RayChecks)
    checks._notes, checks._lock, checks.wake = [], __import__("threading").Lock(), None
    checks.cluster = _Cluster(answers)  # type: ignore[assignment]
    return checks


def test_a_check_on_the_cluster_answers_as_the_local_runner() -> None:
    from lanes_es.adapters.ray_host import HostResult
    from lanes_es.ports import Cancel, IntegrationError

    checks = _checks({"ok": HostResult(attempt_id="1", findings=[]), "bad": HostResult(attempt_id="2", findings=["bad:A0"]),
                      "broken": HostResult(attempt_id="3", error="no space left")})
    assert checks.run_check(None, "ok", {}).findings == []
    assert checks.run_check(None, "bad", {}).findings == ["bad:A0"]
    with pytest.raises(IntegrationError, match="could not complete: no space left"):
        checks.run_check(None, "broken", {})  # a run that could not complete is a failure, never a pass
    cancel = Cancel()
    cancel.set()
    assert checks.run_check(None, "ok", {}, cancel).cancelled  # not even sent


def test_an_earlier_coordinators_attempts_are_collected_cancelled_or_lost() -> None:
    from types import SimpleNamespace

    from lanes_es.adapters.ray_host import HostResult

    checks = _checks({"done": HostResult(attempt_id="done", state="finished"),
                      "busy": HostResult(attempt_id="busy", state="running"),
                      "gone": HostResult(attempt_id="gone", state="unknown")})
    sent = {key: SimpleNamespace(node="n1", task_id="t0", tree="x", kind="check") for key in ("done", "busy", "gone")}
    checks.settle_open(sent)
    assert checks.cluster.asked == [("n1", key, True) for key in ("done", "busy", "gone")]  # type: ignore[attr-defined]
    assert [(note.kind, note.attempt_id, note.detail.split()[0]) for note in checks.drain()] == [
        ("ended", "done", "collected"), ("ended", "busy", "cancelled"), ("lost", "gone", "its")]
    assert checks.drain() == []


class _FlakyRay:
    """What `ray.init` does on a busy head: the proxy's refusals first, then a connection."""

    def __init__(self, refusals: list[str]) -> None:
        self.refusals, self.calls = list(refusals), 0

    def init(self, **_: object) -> None:
        self.calls += 1
        if self.refusals:
            raise RuntimeError(self.refusals.pop(0))

    def is_initialized(self) -> bool:
        return False

    def shutdown(self) -> None:
        pass


@pytest.mark.parametrize("said", ["Starting Ray client server failed. See ray_client_server_23001.err for detailed logs.",
                                  "Proxy failed to Connect to backend! Check `ray_client_server.err`",
                                  "Initialization failure from server:\nTraceback (most recent call last):\n  File "
                                  "\"proxier.py\", line 765, in Datapath\n    if not self.proxy_manager."
                                  "start_specific_server(\npsutil.ZombieProcess: PID still exists but it's a zombie",
                                  "Request can't be sent because the Ray client has already been disconnected due to "
                                  "an error. Last exception: <_MultiThreadedRendezvous of RPC that terminated>"])
def test_a_busy_heads_refusal_is_tried_again_and_anything_else_is_said_at_once(said: str) -> None:
    from lanes_es.adapters.ray_cluster import CLIENT_SERVER_STARTS, _init

    busy = _FlakyRay([said] * (CLIENT_SERVER_STARTS - 1))
    _init(busy, "ray://127.0.0.2:10001")
    assert busy.calls == CLIENT_SERVER_STARTS
    always = _FlakyRay([said] * CLIENT_SERVER_STARTS)
    with pytest.raises(RuntimeError, match="fail|disconnected"):
        _init(always, "ray://127.0.0.2:10001")
    assert always.calls == CLIENT_SERVER_STARTS
    refused = _FlakyRay(["ray client connection timeout"])  # what a wrong token gets
    with pytest.raises(RuntimeError, match="timeout"):
        _init(refused, "ray://127.0.0.2:10001")
    assert refused.calls == 1


def test_what_the_head_said_reaches_the_user_on_one_line() -> None:
    from lanes_es.adapters.ray_cluster import _said

    assert _said(RuntimeError("Initialization failure from server:\nTraceback (most recent call last):\n  File "
                              "\"proxier.py\", line 765\npsutil.ZombieProcess: a zombie (pid=3343)\n")) == \
        "Initialization failure from server: psutil.ZombieProcess: a zombie (pid=3343)"
    assert _said(ConnectionError("ray client connection timeout")) == "ray client connection timeout"
    assert _said(TimeoutError()) == "TimeoutError"

