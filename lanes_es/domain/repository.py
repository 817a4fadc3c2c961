"""`RepositoryIdentity`: which repository, and which checkout of it, a confirmation is given in (pure).

Two facts name "the repository" in lanes-es. The repository id (made once per clone,
`<git common dir>/lanes-es/repository-id`) keys the clone's Initiatives in a shared store
(`initiative:<repository id>:<slug>`); the checkout is the coordinator's top level by real
path, where the batch branch, the projections and the Lanes' links live. A whole copy of a
checkout keeps the id but is another checkout, so a confirmation covers both: the user
confirms a batch for a particular checkout. `BatchAuthorized` records them as its
`repository_id` and `repository` fields (v3); `of_authorization` reads them back without a
schema change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RepositoryIdentity:
    repository_id: str | None  # None: a store from before repository ids, or a read-only command before the first write
    checkout: str              # the checkout's top level, real path

    @classmethod
    def of_authorization(cls, authorization: Any) -> "RepositoryIdentity | None":
        """What a recorded authorization names; None for one from before the `repository` field."""
        if getattr(authorization, "repository", None) is None:
            return None
        return cls(repository_id=getattr(authorization, "repository_id", None), checkout=authorization.repository)

    def describe(self) -> str:
        return f"{self.checkout} (repository id {self.repository_id or 'none yet'})"
