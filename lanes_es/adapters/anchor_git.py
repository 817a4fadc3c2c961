"""The checkpoint ref in git: read it, describe integrated commits, and append a commit to it.

The ref `refs/lanes-es/checkpoints/<batch_id>` holds one commit per checkpoint; its tree
has `checkpoint` (the newest signed note), `attestations/<version>-<task>.dsse.json` and,
once the batch settled, `summary.dsse.json`. It travels with `git push` of that ref and
survives the loss of the store.

A write is ONE spawn of `git fast-import`: it stores the blobs, builds the tree from the
parent's tree plus the new files, commits, and updates the ref only when the new commit
contains the ref's current value (a compare-and-swap: a writer that lost a race is
refused and changes nothing). No hook runs, no working tree or index is touched. A read
is one `cat-file --batch`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Sequence

import msgspec

from lanes_es.audit.anchor import AnchorRefused, AnchorState, checkpoint_ref
from lanes_es.audit.attestation import CHECKPOINT_PATH

from .anchored_marker import marker_path, read_marker
from .files import write_atomic
from .git import batch_identity_env, cat_file_batch, git, git_ok


class GitAnchor:
    def __init__(self, state_dir: Path | None) -> None:
        self._state_dir = state_dir  # where the anchored size is remembered (the store's lock dir)

    # ------------------------------------------------------------ reading

    def read_checkpoint(self, root: str, batch_id: str, requests: Sequence[tuple[str, str | None]] = ()
                        ) -> tuple[str | None, str | None, dict[str, tuple[str, bytes | None]]]:
        ref = checkpoint_ref(batch_id)
        found = cat_file_batch(root, [ref, f"{ref}:{CHECKPOINT_PATH}", *_description_names(requests)])
        commit, note = found[0], found[1]
        described = _descriptions(requests, found[2:])
        if commit is None:
            return None, None, described
        return commit[0], note[2].decode("utf-8", "replace") if note else None, described

    def describe(self, root: str, requests: Sequence[tuple[str, str | None]]) -> dict[str, tuple[str, bytes | None]]:
        return _descriptions(requests, cat_file_batch(root, _description_names(requests)))

    # ------------------------------------------------------------ writing

    def write(self, root: str, batch_id: str, parent: str | None, files: dict[str, bytes], message: str) -> None:
        ref = checkpoint_ref(batch_id)
        identity = batch_identity_env()
        stream = [f"commit {ref}\n".encode(),
                  f"committer {identity['GIT_COMMITTER_NAME']} <{identity['GIT_COMMITTER_EMAIL']}> "
                  f"{int(time.time())} +0000\n".encode(),
                  _data(message.encode())]
        if parent:
            stream.append(f"from {parent}\n".encode())
        for path, content in sorted(files.items()):
            stream += [f"M 100644 inline {path}\n".encode(), _data(content)]
        stream.append(b"\ndone\n")
        result = git_ok(root, "fast-import", "--quiet", "--done", stdin=b"".join(stream))
        if result.exit_code != 0:
            raise AnchorRefused(f"the checkpoint ref {ref} moved while this tick wrote it, or git refused the "
                                f"write ({result.error_text or 'no message'}); the next tick writes it again")

    # ------------------------------------------------------------ the log last anchored

    def _marker(self, batch_id: str) -> Path | None:
        return marker_path(self._state_dir, batch_id) if self._state_dir else None

    def anchor_state(self, batch_id: str) -> AnchorState | None:
        """The state kept by `save_anchor_state`; a marker of an older version holds only the size."""
        data = read_marker(self._state_dir, batch_id) if self._state_dir else None
        if data is None:
            return None
        try:
            return msgspec.json.decode(data, type=AnchorState)
        except (msgspec.DecodeError, RecursionError):
            pass
        try:
            return AnchorState(size=int(data))
        except ValueError:
            return None  # unreadable: the next checkpoint reads the log whole and writes it again

    def save_anchor_state(self, batch_id: str, state: AnchorState) -> None:
        marker = self._marker(batch_id)
        if marker is not None:
            marker.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(marker, msgspec.json.encode(state) + b"\n", marker.parent, mode=0o644)


def _description_names(requests: Sequence[tuple[str, str | None]]) -> list[str]:
    names = []
    for commit, path in requests:
        names += [f"{commit}^{{tree}}", f"{commit}:{path}" if path else f"{commit}:"]
    return names


def _descriptions(requests: Sequence[tuple[str, str | None]], found: Sequence[tuple[str, str, bytes] | None]
                  ) -> dict[str, tuple[str, bytes | None]]:
    described = {}
    for index, (commit, path) in enumerate(requests):
        tree, blob = found[2 * index], found[2 * index + 1]
        described[commit] = (tree[0] if tree else "", blob[2] if blob and path and blob[1] == "blob" else None)
    return described


def _data(content: bytes) -> bytes:
    return f"data {len(content)}\n".encode() + content + b"\n"


# ---------------------------------------------------------------- what verify reads


def read_anchor(root: str, batch_id: str) -> tuple[str | None, dict[str, bytes]]:
    """The checkpoint note and every attestation (path -> envelope) on the batch's ref. Two spawns."""
    ref = checkpoint_ref(batch_id)
    listed = git_ok(root, "ls-tree", "-r", "-z", ref)
    if listed.exit_code != 0:
        return None, {}
    entries = []
    for line in listed.stdout.split(b"\0"):
        if not line:
            continue
        meta, _, path = line.partition(b"\t")
        entries.append((meta.split(b" ")[2].decode(), path.decode("utf-8", "replace")))
    contents = cat_file_batch(root, [object_id for object_id, _ in entries])
    files = {path: found[2] for (_, path), found in zip(entries, contents) if found is not None}
    note = files.pop(CHECKPOINT_PATH, None)
    attestations = {path: data for path, data in files.items() if path.startswith("attestations/")}
    return (note.decode("utf-8", "replace") if note is not None else None), attestations


def branch_history(root: str, branch: str, base: str,
                   recorded_head: str | None = None) -> tuple[list[tuple[str, str]] | None, str | None]:
    """The batch branch's first-parent commits after `base`, oldest first, with their trees. One spawn; a
    branch deleted after landing is read from its `recorded_head` (one more)."""
    listed = git_ok(root, "log", "--first-parent", "--format=%H %T", f"refs/heads/{branch}", f"^{base}", "--")
    if listed.exit_code != 0 and recorded_head and all(c in "0123456789abcdef" for c in recorded_head):
        listed = git_ok(root, "log", "--first-parent", "--format=%H %T", recorded_head, f"^{base}", "--")
    if listed.exit_code != 0:
        return None, f"the batch branch {branch} or its base {base[:12]} is not in {root}"
    pairs = [tuple(line.split(" ", 1)) for line in listed.text.splitlines() if line]
    return [(commit, tree) for commit, tree in reversed(pairs)], None  # type: ignore[misc]


def checkpoint_history(root: str, batch_id: str) -> list[tuple[str, str | None]]:
    """Every commit the ref's history holds with its checkpoint note (None when it has none), oldest first.
    Two spawns (none past the first without a ref)."""
    ref = checkpoint_ref(batch_id)
    listed = git_ok(root, "log", "--format=%H", ref, "--")
    if listed.exit_code != 0:
        return []
    commits = list(reversed(listed.text.split()))
    found = cat_file_batch(root, [f"{commit}:{CHECKPOINT_PATH}" for commit in commits])
    return [(commit, item[2].decode("utf-8", "replace") if item is not None else None)
            for commit, item in zip(commits, found)]
