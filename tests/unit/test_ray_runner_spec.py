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
