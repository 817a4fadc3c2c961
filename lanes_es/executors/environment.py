"""An Executor's environment: the user's (their API keys, HOME, PATH), none of the coordinator's.

Taken out: every LANES_ES_* variable of the coordinator (its store URL, signing key, statistics
file, ...) but LANES_ES_EXECUTOR_*, the names a user gives what is meant for the Executors; and
the git variables that would point the Executor's git at another repository than its Lane's. Put
in: the Executor contract's variables, and what the adapter adds (its agent's own config).
`argv_for_the_record` gives the command as the log keeps it: the prompt as its digest, and the
value of an option whose name says it is secret masked.
"""

from __future__ import annotations

import re
from typing import Mapping

COORDINATOR_PREFIX = "LANES_ES_"
FOR_THE_EXECUTOR_PREFIX = "LANES_ES_EXECUTOR_"
GIT_LOCATORS = frozenset({"GIT_DIR", "GIT_WORK_TREE", "GIT_COMMON_DIR", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY",
                          "GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_NAMESPACE", "GIT_CEILING_DIRECTORIES"})
SECRET_NAME = re.compile(r"(key|token|secret|password|passwd|credential|auth)", re.IGNORECASE)
MASK = "***"


def executor_environment(user: Mapping[str, str], contract: Mapping[str, str],
                         added: Mapping[str, str] | None = None) -> dict[str, str]:
    """The user's environment without the coordinator's variables, with the contract's and the adapter's."""
    kept = {name: value for name, value in user.items() if name not in GIT_LOCATORS and (
        not name.startswith(COORDINATOR_PREFIX) or name.startswith(FOR_THE_EXECUTOR_PREFIX))}
    return {**kept, **contract, **(added or {})}


def argv_for_the_record(argv: list[str], prompt: str | None = None, prompt_digest: str | None = None) -> list[str]:
    """`argv` with the prompt replaced by `<prompt DIGEST>` and secret-looking option values masked
    (`--api-key X`, `--token=X`, `API_KEY=X`)."""
    shown: list[str] = []
    mask_next = False
    for argument in argv:
        if prompt is not None and argument == prompt:
            shown.append(f"<prompt {prompt_digest}>")
        elif mask_next:
            shown.append(MASK)
        elif "=" in argument and SECRET_NAME.search(argument.split("=", 1)[0]):
            shown.append(argument.split("=", 1)[0] + "=" + MASK)
        else:
            shown.append(argument)
        mask_next = argument.startswith("-") and "=" not in argument and bool(SECRET_NAME.search(argument))
    return shown
