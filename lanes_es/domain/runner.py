"""Where a batch's checks, Lane QA and Executor attempts run: the runner a user names.

`local` (the default): processes of the coordinator's machine. `ray://HOST:PORT`: the Ray cluster whose
Ray Client server listens there (the `ray` extra). The text is parsed here, purely; the adapters
(`lanes_es/adapters/ray_cluster.py`) connect. What is recorded with the authorization is the canonical
text this returns, never a credential.
"""

from __future__ import annotations

import re

LOCAL = "local"
RAY_SCHEME = "ray://"
RUNNER_ENV = "LANES_ES_RUNNER"
# A host name or an IPv4 address (letters, digits, dots, dashes), or an IPv6 address in brackets.
_HOST = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?|\[[0-9A-Fa-f:.]{2,45}\])")


class InvalidRunner(ValueError):
    """The runner text is neither `local` nor `ray://HOST:PORT`; the message says which part is wrong."""


def parse_runner(text: str) -> str:
    """`local`, or `ray://HOST:PORT` with a valid host and a port 1..65535, as canonical text."""
    value = text.strip()
    if value == LOCAL:
        return LOCAL
    if not value.startswith(RAY_SCHEME):
        raise InvalidRunner(f"runner {text!r} is neither 'local' nor 'ray://HOST:PORT'")
    host, separator, port = value[len(RAY_SCHEME):].rpartition(":")
    if not separator or not _HOST.fullmatch(host):
        raise InvalidRunner(f"runner {text!r} names no host: write ray://HOST:PORT (the Ray Client server)")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidRunner(f"runner {text!r} has no port between 1 and 65535: write ray://HOST:PORT")
    return f"{RAY_SCHEME}{host.lower()}:{int(port)}"


def is_ray(runner: str | None) -> bool:
    return bool(runner) and runner.startswith(RAY_SCHEME)  # type: ignore[union-attr]


def ray_address(runner: str) -> str:
    """`HOST:PORT` of a parsed `ray://HOST:PORT`."""
    return runner[len(RAY_SCHEME):]
