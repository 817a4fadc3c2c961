"""The connection to a Ray cluster (the `ray` runner): Ray imported only here and only when asked for,
token authentication required, and the cluster's nodes as lanes-es sees them.

A coordinator outside the cluster connects through Ray Client (`ray://HOST:PORT`, the head's client
server). lanes-es never connects without Ray's token authentication (`RAY_AUTH_MODE=token`, Ray 2.52 and
later): the token comes from `RAY_AUTH_TOKEN`, the file `RAY_AUTH_TOKEN_PATH` names, or Ray's default
`~/.ray/auth_token`, and is never written to the log. Workers' output is not streamed to the coordinator
(`log_to_driver=False`): nothing a check or an agent prints reaches the coordinator but the bounded,
typed result lanes-es returns.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

from lanes_es.domain.runner import ray_address
from lanes_es.errors import Refusal

RAY_EXTRA_MISSING = "the ray runner needs Ray on this machine: pip install 'lanes-es[ray]'"
NAMESPACE = "lanes-es"
# The resource a node offers check slots with (`ray start --resources='{"lanes_es_slots": 12}'`): a
# check takes one; a node without it (a head kept for the control plane) runs none.
SLOT_RESOURCE = "lanes_es_slots"
TOKEN_HINT = ("set RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH) to the cluster's token, which `ray get-auth-token` "
              "prints on its head")


class RayUnavailable(Refusal):
    """The `ray` extra is missing, the token is missing, or the cluster cannot be reached."""


def ray_module() -> Any:
    """`ray`, imported; RayUnavailable naming the extra when it is not installed."""
    try:
        import ray
    except ImportError:
        raise RayUnavailable(RAY_EXTRA_MISSING) from None
    return ray


def require_token_auth(environ: dict[str, str] | None = None) -> None:
    """Token authentication on for this process and everything it starts, and a token to send; else a
    refusal. Must run before Ray reads its configuration (at connect)."""
    env = os.environ if environ is None else environ
    mode = env.get("RAY_AUTH_MODE", "token").strip().lower()
    if mode != "token":
        raise RayUnavailable(f"RAY_AUTH_MODE is {mode!r}: lanes-es connects to a Ray cluster only with token "
                             f"authentication (RAY_AUTH_MODE=token, the cluster started with it too)")
    token_path = env.get("RAY_AUTH_TOKEN_PATH")
    default = Path(env.get("HOME", str(Path.home()))) / ".ray" / "auth_token"
    if not env.get("RAY_AUTH_TOKEN", "").strip() and not _readable(token_path) and not _readable(str(default)):
        where = f"RAY_AUTH_TOKEN_PATH ({token_path}) is not a readable file" if token_path else "no token is set"
        raise RayUnavailable(f"the Ray cluster needs its token and {where}: {TOKEN_HINT}")
    env["RAY_AUTH_MODE"] = "token"


def _readable(path: str | None) -> bool:
    try:
        return bool(path) and os.path.getsize(path) > 0 and os.access(path, os.R_OK)  # type: ignore[arg-type]
    except OSError:
        return False


_CONNECTED: dict[str, Any] = {}
_LOCK = threading.Lock()


def connect(runner: str) -> Any:
    """`ray`, connected to the cluster `runner` (`ray://HOST:PORT`) once per process; RayUnavailable when the
    extra or the token is missing or the cluster does not answer."""
    with _LOCK:
        if _CONNECTED.get("runner") == runner:
            return _CONNECTED["ray"]
        require_token_auth()
        # gRPC's informational lines (a fork while its threads run: every git spawn) are not the user's
        os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
        # Without this, gRPC's fork handlers run in every child the coordinator forks (each git and check
        # spawn) and may abort it before its exec (SIGABRT: a git commit that "failed" with -6). Read by
        # gRPC when it is first imported: here, before Ray is.
        os.environ["GRPC_ENABLE_FORK_SUPPORT"] = "false"
        ray = ray_module()
        # Ray Client's own log lines (a data channel that broke) are not the user's: a connection that fails is
        # said once, by the refusal below; one that breaks later is a lost attempt, in the log
        logging.getLogger("ray.util.client").setLevel(logging.CRITICAL)
        if ray.is_initialized():
            ray.shutdown()
        try:
            _init(ray, runner)
        except (ConnectionError, TimeoutError, RuntimeError) as error:
            raise RayUnavailable(f"the Ray cluster at {runner} did not accept the connection ({_said(error)}): check "
                                 f"that its head runs the Ray Client server there and that the token is its token "
                                 f"({TOKEN_HINT})") from None
        _CONNECTED.update(runner=runner, ray=ray)
        return ray


CLIENT_SERVER_STARTS = 3  # the head starts a client server per connection; on a loaded head that may time out
# What Ray says when the head is busy, not when it refuses this coordinator (Ray 2.5x): its proxy's client server
# for this connection did not come up ("Starting Ray client server failed", "Proxy failed to Connect to
# backend!", or its own traceback through start_specific_server, as when that server's process died at once), or
# the connection broke while it was being set up ("... the Ray client has already been disconnected due to an
# error"). A wrong token is not among them: Ray says "ray client connection timeout", after 30 s.
BUSY_HEAD = ("client server failed", "Proxy failed to Connect to backend", "start_specific_server",
             "already been disconnected")


def _init(ray: Any, runner: str) -> None:
    for attempt in range(CLIENT_SERVER_STARTS):
        try:
            ray.init(address=f"ray://{ray_address(runner)}", namespace=NAMESPACE, logging_level=logging.ERROR,
                     log_to_driver=False)
            return
        except (ConnectionError, RuntimeError) as error:
            # Ray's proxy gave up waiting for the client server it starts for this connection: a busy head, not
            # a refusal; connect again (anything else, such as a wrong token, is said at once)
            if not any(said in str(error) for said in BUSY_HEAD) or attempt == CLIENT_SERVER_STARTS - 1:
                raise
            if ray.is_initialized():
                ray.shutdown()


def _said(error: BaseException) -> str:
    """What Ray said, on one line: a traceback the head sent along is cut to its first and last lines."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    if len(lines) <= 1:
        return lines[0] if lines else type(error).__name__
    return f"{lines[0].rstrip(':')}: {lines[-1]}"


def disconnect() -> None:
    with _LOCK:
        ray = _CONNECTED.pop("ray", None)
        _CONNECTED.clear()
        if ray is not None and ray.is_initialized():
            ray.shutdown()


def slot_nodes(ray: Any) -> dict[str, int]:
    """The alive nodes that offer check slots: node id -> how many."""
    return {node["NodeID"]: int(node["Resources"].get(SLOT_RESOURCE, 0)) for node in ray.nodes()
            if node.get("Alive") and node["Resources"].get(SLOT_RESOURCE, 0) >= 1}
