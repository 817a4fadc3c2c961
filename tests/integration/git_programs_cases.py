"""Repositories armed with one program each, the way an Executor can arm them: through the repository's own
config (common, a worktree's, a submodule's, an included file) and attributes. For each key, the git call of
a lanes-es call site that would run the program, and what plain git runs to show that it does.

Every program touches its marker file; filters pass their input through (`cat`) so that plain git works.
"""

from __future__ import annotations

import http.server
import os
import shlex
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from lanes_es.adapters.leak_restore import PATCH_ARGS
from tests.gitfixtures import commit_all, git_out, head, run_git, write_file

STATUS = ("status", "--porcelain=v2", "--branch", "-z", "--untracked-files=all", "--ignore-submodules=none",
          "--no-renames")
MISSING = b"1234567890123456789012345678901234567890\n"  # an object no repository holds: a lazy fetch's trigger


@dataclass
class Armed:
    cwd: Path
    args: tuple[str, ...]  # the call site's git command
    plain_args: tuple[str, ...] | None = None  # what shows plain git runs the program (default: args)
    stdin: bytes | None = None
    tty: bool = False  # plain git runs a pager only on a terminal
    plain_runs: bool = True  # False: git itself already refuses to run it (said in the case)


def program(base: Path, marker: Path, body: str = "exit 0") -> str:
    """An executable that touches `marker`, then runs `body`."""
    path = base / f"program-{len(list(base.glob('program-*')))}"
    path.write_text(f"#!/bin/sh\ntouch {shlex.quote(str(marker))}\n{body}\n")
    path.chmod(0o755)
    return str(path)


def passing_filter(marker: Path) -> str:
    return f"touch {shlex.quote(str(marker))}; cat"


def repo(base: Path, name: str = "repo", attributes: str | None = None, files: dict[str, str] | None = None) -> Path:
    root = base / name
    root.mkdir(parents=True)
    run_git(root, "init", "-q", "-b", "main")
    run_git(root, "config", "user.name", "Test User")
    run_git(root, "config", "user.email", "test@example.invalid")
    write_file(root, "a.txt", "one\n")
    if attributes is not None:
        write_file(root, ".gitattributes", attributes)
    for relative, content in (files or {}).items():
        write_file(root, relative, content)
    commit_all(root, "base", batch_identity=False)
    return root


def same_size_edit(path: Path) -> None:
    """Change a tracked file and keep its size: git must read it (through its clean filter) to compare."""
    text = path.read_text()
    path.write_text(text.swapcase() if text.swapcase() != text else text[::-1])


# ---------------------------------------------------------------- filters


def filter_clean(base: Path, marker: Path) -> Armed:
    root = repo(base, attributes="* filter=evil\n")
    run_git(root, "config", "filter.evil.clean", passing_filter(marker))
    run_git(root, "config", "filter.evil.required", "true")
    write_file(root, "a.txt", "changed\n")
    return Armed(root, ("add", "-A"))


def filter_process(base: Path, marker: Path) -> Armed:
    root = repo(base, attributes="* filter=evil\n")
    run_git(root, "config", "filter.evil.process", program(base, marker))
    write_file(root, "a.txt", "changed\n")
    return Armed(root, ("add", "-A"))


def filter_smudge(base: Path, marker: Path) -> Armed:
    """The integration's fast-forward checks the new files out through their smudge filter."""
    root = repo(base, attributes="* filter=evil\n")
    run_git(root, "checkout", "-q", "-b", "side")
    write_file(root, "b.txt", "two\n")
    side = commit_all(root, "side", batch_identity=False)
    run_git(root, "checkout", "-q", "main")
    run_git(root, "config", "filter.evil.smudge", passing_filter(marker))
    return Armed(root, ("merge", "--ff-only", "--quiet", side))


def filter_included(base: Path, marker: Path) -> Armed:
    """A filter defined in a file the repository's config includes (the include quoted, with an escape)."""
    root = repo(base, attributes="* filter=included\n")
    (base / "evil dir").mkdir()
    (base / "evil dir" / "x.cfg").write_text(f'[filter "included"]\n\tclean = {passing_filter(marker)}\n')
    with open(root / ".git" / "config", "a") as config:
        config.write('[includeIf "gitdir:/"]\n\tpath = "../../evil dir/x.cfg" ; a comment\n')
    write_file(root, "a.txt", "changed\n")
    return Armed(root, ("add", "-A"))


def filter_worktree_config(base: Path, marker: Path) -> Armed:
    """A filter in one Lane's own `config.worktree` (extensions.worktreeConfig), run by the Lane's `add -A`."""
    root = repo(base, attributes="* filter=lane\n")
    run_git(root, "config", "extensions.worktreeConfig", "true")
    lane = base / "lane"
    run_git(root, "worktree", "add", "-q", "-b", "lane", str(lane))
    run_git(lane, "config", "--worktree", "filter.lane.clean", passing_filter(marker))
    write_file(lane, "a.txt", "changed\n")
    return Armed(lane, ("add", "-A"))


def filter_in_embedded_submodule(base: Path, marker: Path) -> Armed:
    """A repository made inside the worktree and added as a gitlink: git status looks inside it (and runs its
    own config's filter there)."""
    root = repo(base)
    sub = root / "sub"
    sub.mkdir()
    run_git(sub, "init", "-q", "-b", "main")
    run_git(sub, "config", "user.name", "Sub")
    run_git(sub, "config", "user.email", "sub@example.invalid")
    write_file(sub, "f.txt", "inner\n")
    write_file(sub, ".gitattributes", "* filter=embedded\n")
    commit_all(sub, "inner", batch_identity=False)
    run_git(root, "add", "sub")
    commit_all(root, "gitlink", batch_identity=False)
    run_git(sub, "config", "filter.embedded.clean", passing_filter(marker))
    same_size_edit(sub / "f.txt")
    return Armed(root, STATUS)


def filter_in_absorbed_submodule(base: Path, marker: Path) -> Armed:
    """A submodule as `git submodule add` makes it: its git directory under the common dir's `modules/`."""
    source = repo(base, "absorbed-source", attributes="* filter=absorbed\n")
    root = repo(base)
    run_git(root, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(source), "sub")
    commit_all(root, "submodule", batch_identity=False)
    run_git(root / "sub", "config", "filter.absorbed.clean", passing_filter(marker))
    same_size_edit(root / "sub" / "a.txt")
    return Armed(root, STATUS)


# ---------------------------------------------------------------- status and checkout


def fsmonitor(base: Path, marker: Path) -> Armed:
    root = repo(base)
    run_git(root, "config", "core.fsmonitor", program(base, marker))
    return Armed(root, STATUS)


def hooks(base: Path, marker: Path) -> Armed:
    root = repo(base)
    hooks_dir = base / "hooks"
    hooks_dir.mkdir()
    (hooks_dir / "pre-commit").write_text(f"#!/bin/sh\ntouch {shlex.quote(str(marker))}\n")
    (hooks_dir / "pre-commit").chmod(0o755)
    run_git(root, "config", "core.hooksPath", str(hooks_dir))
    return Armed(root, ("commit", "--allow-empty", "-q", "-m", "x"))


# ---------------------------------------------------------------- merge and diff drivers


def _diverged(base: Path, attributes: str) -> tuple[Path, str]:
    """main and side both change m.txt, far apart: a content merge any merge driver would be asked for."""
    root = repo(base, attributes=attributes, files={"m.txt": "l1\nl2\nl3\nl4\nl5\n"})
    run_git(root, "checkout", "-q", "-b", "side")
    write_file(root, "m.txt", "L1\nl2\nl3\nl4\nl5\n")
    side = commit_all(root, "side", batch_identity=False)
    run_git(root, "checkout", "-q", "main")
    write_file(root, "m.txt", "l1\nl2\nl3\nl4\nL5\n")
    commit_all(root, "main", batch_identity=False)
    return root, side


def merge_driver(base: Path, marker: Path) -> Armed:
    """The candidate is built with merge-tree, which asks the path's merge driver."""
    root, side = _diverged(base, "m.txt merge=evil\n")
    run_git(root, "config", "merge.evil.driver", program(base, marker))
    return Armed(root, ("merge-tree", "--write-tree", "HEAD", side))


def merge_default(base: Path, marker: Path) -> Armed:
    """`merge.default` names the driver of every path without a merge attribute."""
    root, side = _diverged(base, "")
    run_git(root, "config", "merge.default", "evil")
    run_git(root, "config", "merge.evil.driver", program(base, marker))
    return Armed(root, ("merge-tree", "--write-tree", "HEAD", side))


LEAK_DIFF = (*PATCH_ARGS, "a.txt")  # the patch a leak restore keeps
PLAIN_DIFF = ("diff", "--binary", "HEAD", "--", "a.txt")


def diff_textconv(base: Path, marker: Path) -> Armed:
    root = repo(base, attributes="a.txt diff=evil\n")
    run_git(root, "config", "diff.evil.textconv", program(base, marker, 'cat "$1"'))
    write_file(root, "a.txt", "changed\n")
    return Armed(root, LEAK_DIFF, plain_args=PLAIN_DIFF)


def diff_command(base: Path, marker: Path) -> Armed:
    root = repo(base, attributes="a.txt diff=evil\n")
    run_git(root, "config", "diff.evil.command", program(base, marker))
    write_file(root, "a.txt", "changed\n")
    return Armed(root, LEAK_DIFF, plain_args=PLAIN_DIFF)


def diff_external(base: Path, marker: Path) -> Armed:
    root = repo(base)
    run_git(root, "config", "diff.external", program(base, marker))
    write_file(root, "a.txt", "changed\n")
    return Armed(root, LEAK_DIFF, plain_args=PLAIN_DIFF)


# ---------------------------------------------------------------- signatures


def _signed_commit(root: Path) -> str:
    """A commit carrying a (made-up) OpenPGP signature: checking it runs gpg.program."""
    body = (f"tree {git_out(root, 'rev-parse', 'HEAD^{tree}')}\nparent {head(root)}\n"
            f"author A <a@example.invalid> 1700000000 +0000\ncommitter A <a@example.invalid> 1700000000 +0000\n"
            f"gpgsig -----BEGIN PGP SIGNATURE-----\n \n iQEz\n -----END PGP SIGNATURE-----\n\nsigned\n")
    return run_git(root, "hash-object", "-t", "commit", "-w", "--stdin", input=body).stdout.decode().strip()


def gpg_verify_on_merge(base: Path, marker: Path) -> Armed:
    root = repo(base)
    signed = _signed_commit(root)
    run_git(root, "config", "merge.verifySignatures", "true")
    run_git(root, "config", "gpg.program", program(base, marker, "exit 1"))
    return Armed(root, ("merge", "--ff-only", "--quiet", signed))


def gpg_show_signature(base: Path, marker: Path) -> Armed:
    root = repo(base)
    signed = _signed_commit(root)
    run_git(root, "config", "log.showSignature", "true")
    run_git(root, "config", "gpg.program", program(base, marker, "exit 1"))
    return Armed(root, ("log", "-n", "1", "--format=%H", signed))


# ---------------------------------------------------------------- pager and editors


def pager(base: Path, marker: Path) -> Armed:
    root = repo(base)
    run_git(root, "config", "core.pager", program(base, marker, "cat >/dev/null"))
    return Armed(root, ("log", "-n", "1"), tty=True)


def editor(base: Path, marker: Path) -> Armed:
    root = repo(base)
    run_git(root, "config", "core.editor", program(base, marker))
    return Armed(root, ("commit", "--allow-empty", "-q", "-e", "-m", "x"))


def sequence_editor(base: Path, marker: Path) -> Armed:
    root = repo(base)
    commit_all(root, "second", batch_identity=False, allow_empty=True)
    run_git(root, "config", "sequence.editor", program(base, marker))
    return Armed(root, ("rebase", "-q", "-i", "HEAD~1"))


# ---------------------------------------------------------------- transports (a lazy fetch of a missing object)


def _promisor(base: Path, url: str) -> Path:
    """A repository whose missing objects git fetches from `url` when asked for one (a partial clone)."""
    root = repo(base)
    run_git(root, "config", "core.repositoryformatversion", "1")
    run_git(root, "config", "extensions.partialClone", "evil")
    run_git(root, "config", "remote.evil.url", url)
    run_git(root, "config", "remote.evil.promisor", "true")
    run_git(root, "config", "protocol.allow", "always")
    return root


def _lazy_fetch(root: Path) -> Armed:
    """cat-file --batch, as the checkpoint and candidate reads run it, asked for an object that is not there."""
    return Armed(root, ("cat-file", "--batch"), stdin=MISSING)


def remote_helper(base: Path, marker: Path) -> Armed:
    root = _promisor(base, f"ext::sh -c touch% {marker}")
    run_git(root, "config", "protocol.ext.allow", "always")
    return _lazy_fetch(root)


def ssh_command(base: Path, marker: Path) -> Armed:
    root = _promisor(base, "ssh://example.invalid/repo.git")
    run_git(root, "config", "core.sshCommand", program(base, marker, "exit 1"))
    return _lazy_fetch(root)


def remote_uploadpack(base: Path, marker: Path) -> Armed:
    """A local remote runs `remote.<name>.uploadpack` on this machine."""
    other = repo(base, "other")
    root = _promisor(base, f"file://{other}")
    run_git(root, "config", "remote.evil.uploadpack", program(base, marker, "exit 1"))
    return _lazy_fetch(root)


def upload_pack_hook(base: Path, marker: Path) -> Armed:
    """`uploadpack.packObjectsHook` is git's own protected key: it is ignored in a repository's config, even
    by plain git (a lazy fetch from a local remote that has the object runs pack-objects without it)."""
    other = repo(base, "other")
    blob = run_git(other, "hash-object", "-w", "--stdin", input=b"only there\n").stdout.strip()
    run_git(other, "config", "uploadpack.packObjectsHook", program(base, marker))
    root = _promisor(base, f"file://{other}")
    run_git(root, "config", "uploadpack.packObjectsHook", program(base, marker))
    run_git(root, "config", "uploadpack.allowAnySHA1InWant", "true")
    run_git(other, "config", "uploadpack.allowAnySHA1InWant", "true")
    return Armed(root, ("cat-file", "--batch"), stdin=blob + b"\n", plain_runs=False)


def alternate_refs_command(base: Path, marker: Path) -> Armed:
    """A repository borrowing another's objects (alternates) runs core.alternateRefsCommand when it fetches."""
    origin = repo(base, "origin")
    root = base / "clone"
    run_git(base, "clone", "-q", "--shared", str(origin), str(root))
    run_git(root, "config", "core.alternateRefsCommand", program(base, marker))
    return Armed(root, ("fetch", "-q", "origin"))


class AuthServer:
    """An HTTP server answering every request 401: git then asks the credential helper, or askpass."""

    def __init__(self) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the http.server name
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="lanes-es test"')
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/repo.git"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


SERVER: list[AuthServer] = []


def _auth_server() -> AuthServer:
    if not SERVER:
        SERVER.append(AuthServer())
    return SERVER[0]


def credential_helper(base: Path, marker: Path) -> Armed:
    root = _promisor(base, _auth_server().url)
    run_git(root, "config", "credential.helper", f"!{program(base, marker)}")
    return _lazy_fetch(root)


def askpass(base: Path, marker: Path) -> Armed:
    root = _promisor(base, _auth_server().url)
    run_git(root, "config", "core.askPass", program(base, marker, "echo secret"))
    return _lazy_fetch(root)


CASES: dict[str, Callable[[Path, Path], Armed]] = {
    "filter.<driver>.clean": filter_clean,
    "filter.<driver>.process": filter_process,
    "filter.<driver>.smudge": filter_smudge,
    "filter in an included config file": filter_included,
    "filter in a Lane's config.worktree": filter_worktree_config,
    "filter in an embedded submodule's config": filter_in_embedded_submodule,
    "filter in an absorbed submodule's config": filter_in_absorbed_submodule,
    "core.fsmonitor": fsmonitor,
    "core.hooksPath (hooks)": hooks,
    "merge.<driver>.driver": merge_driver,
    "merge.default": merge_default,
    "diff.<driver>.textconv": diff_textconv,
    "diff.<driver>.command": diff_command,
    "diff.external": diff_external,
    "gpg.program (merge.verifySignatures)": gpg_verify_on_merge,
    "gpg.program (log.showSignature)": gpg_show_signature,
    "core.pager": pager,
    "core.editor": editor,
    "sequence.editor": sequence_editor,
    "remote helper (ext::)": remote_helper,
    "core.sshCommand": ssh_command,
    "remote.<name>.uploadpack": remote_uploadpack,
    "uploadpack.packObjectsHook": upload_pack_hook,
    "core.alternateRefsCommand": alternate_refs_command,
    "credential.helper": credential_helper,
    "core.askPass": askpass,
}


def plain_env() -> dict[str, str]:
    """The environment of plain git: none of the variables that would keep it from running a program."""
    dropped = ("GIT_EDITOR", "GIT_SEQUENCE_EDITOR", "GIT_PAGER", "PAGER", "EDITOR", "VISUAL", "GIT_ASKPASS",
               "SSH_ASKPASS", "GIT_ALLOW_PROTOCOL", "GIT_SSH", "GIT_SSH_COMMAND", "GIT_EXTERNAL_DIFF")
    env = {key: value for key, value in os.environ.items()
           if key not in dropped and not key.startswith("GIT_CONFIG")}
    env.update({"GIT_TERMINAL_PROMPT": "0", "TERM": "xterm"})
    return env
