"""No program a repository's config names runs in lanes-es's git: what the runner gives each call.

Lanes share the repository's git directory, so an Executor can write its config (`.git/config`, a
worktree's `config.worktree`, a submodule's config, a file any of them includes) and its attributes
(`.gitattributes` in the tree, `.git/info/attributes`). git 2.39 reads all of them on every call and has
no switch to ignore them, so the runner overrides, on every call, each key that can name a program:

- keys with one name (`core.fsmonitor`, the editors, signature checks, `submodule.recurse`, credential
  helpers): fixed values given on the command line (`-c`), which beats every file;
- transports (a lazy fetch from a promisor remote would run `core.sshCommand`, `ext::` and other remote
  helpers, `uploadpack`, credential helpers, `core.askPass`, `core.alternateRefsCommand`):
  `GIT_ALLOW_PROTOCOL` set empty allows none, whatever the config says; lanes-es's git never fetches;
- drivers, named by attributes (`filter=NAME`, `merge=NAME`) and defined by `filter.NAME.*` and
  `merge.NAME.driver`: the names the repository's own config files define are read here (no spawn:
  git's config syntax, includes followed) and each is overridden through `GIT_CONFIG_COUNT` (a name may
  hold any character, which `-c NAME=VALUE` cannot carry): filters blank (git then stores and checks out
  the bytes as they are), merge drivers `false` (a path that needs one conflicts in the candidate);
- diff drivers (`textconv`, `command`) and `diff.external` run only for porcelain patches: the one call
  that makes one passes `--no-ext-diff --no-textconv`.

The files read are the repository's: its common config and every worktree's `config.worktree`, the
config of every submodule git status can look inside (those under `modules/`, and those a worktree's
index holds as a gitlink with a git directory of its own), and what they include. The user's global and
system config are not the repository's: a driver defined there (git-lfs's, say) still runs, unless the
repository's own config redefines that name. Each file is parsed again only when it changed (its size,
times or inode), so a call pays a few `stat`s.
"""

from __future__ import annotations

import os
import re
import threading
from typing import Any, Callable, Iterator

from lanes_es.adapters.files import read_capped

# Given on every call as `-c KEY=VALUE`: a value on the command line beats every config file.
FIXED_CONFIG = (
    ("core.hooksPath", "/dev/null"),  # hooks
    ("commit.gpgsign", "false"),  # gpg.program, gpg.ssh.program, ...: no signing
    ("merge.verifySignatures", "false"),  # ... and no signature checks either
    ("log.showSignature", "false"),
    ("maintenance.auto", "false"),  # a commit or merge would start `git maintenance run --auto`
    ("gc.auto", "0"),
    ("core.fsmonitor", "false"),  # a hook program status and add would run
    ("submodule.recurse", "false"),  # a checkout or merge would run git inside each submodule
    ("credential.helper", ""),  # empty resets the list of helpers
)
# The environment of every call: programs git takes from the environment before its config.
FIXED_ENV = {
    "GIT_ALLOW_PROTOCOL": "",  # no transport at all: protocol.*.allow in a config cannot widen it
    "GIT_EDITOR": ":",  # ":" is git's own "no editor"
    "GIT_SEQUENCE_EDITOR": ":",
    "GIT_ASKPASS": "",  # empty: no askpass program (SSH_ASKPASS is not consulted either)
    "GIT_PAGER": "cat",  # "cat" is git's own "no pager" (and the runner's output is never a terminal)
}
# How each kind of driver is kept from running: blank filter commands (and not required, or git would
# refuse the file), a merge driver that always conflicts.
FILTER_KEYS = (("clean", ""), ("smudge", ""), ("process", ""), ("required", "false"))
MERGE_KEYS = (("driver", "false"),)

MAX_CONFIG_BYTES = 4 * 1024 * 1024
MAX_INDEX_BYTES = 512 * 1024 * 1024
MAX_INCLUDE_DEPTH = 10  # git's own
MAX_SUBMODULE_DEPTH = 4
GITLINK_MODE = b"\x00\x00\xe0\x00"  # 0o160000, as an index entry stores it


def driver_config(root: str) -> list[tuple[str, str]]:
    """The overrides of every filter and merge driver the repository at `root` defines (none outside one)."""
    filters, merges = _SCAN.names(root)
    return ([(f"filter.{name}.{key}", value) for name in sorted(filters) for key, value in FILTER_KEYS]
            + [(f"merge.{name}.{key}", value) for name in sorted(merges) for key, value in MERGE_KEYS])


def config_env(entries: list[tuple[str, str]], base: dict[str, str]) -> dict[str, str]:
    """`entries` as GIT_CONFIG_COUNT/KEY_n/VALUE_n, after any the caller's environment already gives."""
    try:
        start = int(base.get("GIT_CONFIG_COUNT", "0") or "0")
    except ValueError:
        start = 0
    env = {"GIT_CONFIG_COUNT": str(start + len(entries))}
    for offset, (key, value) in enumerate(entries):
        env[f"GIT_CONFIG_KEY_{start + offset}"] = key
        env[f"GIT_CONFIG_VALUE_{start + offset}"] = value
    return env


# ---------------------------------------------------------------- which files


class _Reads:
    """Every path one scan looked at, with what it was then (None: absent): while each still is, so is the scan."""

    def __init__(self) -> None:
        self.seen: dict[str, tuple[int, ...] | None] = {}

    def look(self, path: str) -> tuple[int, ...] | None:
        if path not in self.seen:
            self.seen[path] = _signature(path)
        return self.seen[path]

    def is_dir(self, path: str) -> bool:
        return self.look(path) is not None and os.path.isdir(path)

    def is_file(self, path: str) -> bool:
        return self.look(path) is not None and os.path.isfile(path)

    def listdir(self, path: str) -> list[str]:
        if self.look(path) is None:  # a directory's times change when an entry comes or goes
            return []
        try:
            return sorted(os.listdir(path))
        except OSError:
            return []

    def still(self) -> bool:
        return all(_signature(path) == signature for path, signature in self.seen.items())


class _Scan:
    """Driver names per `git -C` directory, kept while every file and directory the scan looked at stays as it
    was (a `stat` each); a file that changed is read again, and parsed again only when it changed itself."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._parsed: dict[tuple[str, str], tuple[tuple[int, ...], Any]] = {}
        self._scans: dict[str, tuple[_Reads, tuple[frozenset[str], frozenset[str]]]] = {}

    def names(self, root: str) -> tuple[frozenset[str], frozenset[str]]:
        key = os.path.abspath(root)
        with self._lock:
            cached = self._scans.get(key)
        if cached is not None and cached[0].still():
            return cached[1]
        reads = _Reads()
        found = self._names(key, reads)
        with self._lock:
            self._scans[key] = (reads, found)
        return found

    def _names(self, root: str, reads: _Reads) -> tuple[frozenset[str], frozenset[str]]:
        located = _git_dirs(root, reads, self)
        if located is None:
            return frozenset(), frozenset()
        filters: set[str] = set()
        merges: set[str] = set()
        done: set[str] = set()
        pending = [(path, 0) for path in self._config_files(*located, reads)]
        while pending:
            path, depth = pending.pop()
            path = os.path.abspath(path)
            if path in done or depth > MAX_INCLUDE_DEPTH:
                continue
            done.add(path)
            reads.look(path)
            found = self.parsed(path, _read_config)
            if found is not None:
                filters |= found[0]
                merges |= found[1]
                pending.extend((include, depth + 1) for include in found[2])
        return frozenset(filters), frozenset(merges)

    def parsed(self, path: str, parse: Callable[[str], Any]) -> Any:
        """`parse(path)`, kept while the file stays as it was; None when there is no such file."""
        signature = _signature(path)
        if signature is None:
            return None
        key = (parse.__name__, path)
        with self._lock:
            cached = self._parsed.get(key)
        if cached is not None and cached[0] == signature:
            return cached[1]
        value = parse(path)
        with self._lock:
            self._parsed[key] = (signature, value)
        return value

    def _config_files(self, git_dir: str, common_dir: str, reads: _Reads) -> Iterator[str]:
        """Every config file of the repository git may read in a call, its submodules' included."""
        gitdirs = [git_dir, common_dir]
        tops: list[tuple[str, str]] = []  # (a worktree's git dir, its top directory)
        if os.path.basename(common_dir) == ".git":
            tops.append((common_dir, os.path.dirname(common_dir)))
        worktrees = os.path.join(common_dir, "worktrees")
        for name in reads.listdir(worktrees):
            gitdir = os.path.join(worktrees, name)
            gitdirs.append(gitdir)
            pointer = os.path.join(gitdir, "gitdir")
            reads.look(pointer)
            top = self.parsed(pointer, _gitfile_pointer)
            if top is not None:
                tops.append((gitdir, os.path.dirname(top)))
        gitdirs.extend(_module_gitdirs(os.path.join(common_dir, "modules"), reads, 0))
        gitdirs.extend(self._submodule_gitdirs(tops, reads, 0))
        for gitdir in dict.fromkeys(gitdirs):
            yield os.path.join(gitdir, "config")
            yield os.path.join(gitdir, "config.worktree")

    def _submodule_gitdirs(self, tops: list[tuple[str, str]], reads: _Reads, depth: int) -> list[str]:
        """The git directories of the submodules each worktree's index holds (git status runs git in them)."""
        if depth >= MAX_SUBMODULE_DEPTH:
            return []
        found: list[str] = []
        for gitdir, top in tops:
            index = os.path.join(gitdir, "index")
            reads.look(index)
            for link in self.parsed(index, _index_gitlinks) or ():
                sub_top = os.path.join(top, link)
                located = _gitdir_at(sub_top, reads, self)
                if located is not None:
                    found.extend(located)
                    found.extend(self._submodule_gitdirs([(located[0], sub_top)], reads, depth + 1))
        return found


def _git_dirs(root: str, reads: _Reads, scan: _Scan) -> tuple[str, str] | None:
    """(git dir, common dir) as git finds them for `git -C root`: GIT_DIR and GIT_COMMON_DIR when set, else the
    nearest `.git` (a directory, or a file naming one) from `root` up, or the git directory `root` is in."""
    named = os.environ.get("GIT_DIR")
    if named:
        git_dir = os.path.join(root, named)
        common = os.environ.get("GIT_COMMON_DIR")
        return git_dir, os.path.join(root, common) if common else _common_of(git_dir, reads, scan)
    directory = os.path.realpath(root)
    while True:
        located = _gitdir_at(directory, reads, scan)
        if located is not None:
            return located
        if reads.is_file(os.path.join(directory, "HEAD")) and reads.is_file(os.path.join(directory, "config")):
            return directory, _common_of(directory, reads, scan)  # inside a git directory
        parent = os.path.dirname(directory)
        if parent == directory:
            return None
        directory = parent


def _gitdir_at(top: str, reads: _Reads, scan: _Scan) -> tuple[str, str] | None:
    """(git dir, common dir) of a worktree top holding `.git` (a directory, or a file naming one)."""
    marker = os.path.join(top, ".git")
    if reads.is_dir(marker):
        return marker, _common_of(marker, reads, scan)
    if reads.is_file(marker):
        target = scan.parsed(marker, _gitfile_target)
        return (target, _common_of(target, reads, scan)) if target is not None else None
    return None


def _gitfile_target(marker: str) -> str | None:
    try:
        text = read_capped(marker, 64 * 1024).decode("utf-8", "replace").strip()
    except (OSError, ValueError):
        return None
    if not text.startswith("gitdir:"):
        return None
    return os.path.join(os.path.dirname(marker), text[len("gitdir:"):].strip())


def _common_of(git_dir: str, reads: _Reads, scan: _Scan) -> str:
    pointer = os.path.join(git_dir, "commondir")
    reads.look(pointer)
    named = scan.parsed(pointer, _commondir)
    return os.path.join(git_dir, named) if named else git_dir


def _commondir(path: str) -> str | None:
    try:
        return read_capped(path, 64 * 1024).decode("utf-8", "replace").strip() or None
    except (OSError, ValueError):
        return None


_SCAN = _Scan()


def _read_config(path: str) -> tuple[set[str], set[str], list[str]] | None:
    try:
        text = read_capped(path, MAX_CONFIG_BYTES).decode("utf-8", "surrogateescape")
    except (OSError, ValueError):
        return None  # unreadable, or larger than any config: git cannot run with it either
    return parse_config(text, os.path.dirname(path))


def _signature(path: str) -> tuple[int, ...] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_ino, info.st_dev, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def _gitfile_pointer(path: str) -> str | None:
    """A worktree's `gitdir` file: the path of its `.git` file."""
    try:
        text = read_capped(path, 64 * 1024).decode("utf-8", "replace").strip()
    except (OSError, ValueError):
        return None
    return text or None


def _module_gitdirs(directory: str, reads: _Reads, depth: int) -> Iterator[str]:
    """The submodule git directories under `modules/` (names may hold slashes; submodules nest)."""
    if depth > 2 * MAX_SUBMODULE_DEPTH:
        return
    for name in reads.listdir(directory):
        path = os.path.join(directory, name)
        if reads.is_file(os.path.join(path, "HEAD")):
            yield path
            yield from _module_gitdirs(os.path.join(path, "modules"), reads, depth + 1)
        elif reads.is_dir(path):
            yield from _module_gitdirs(path, reads, depth + 1)


# ---------------------------------------------------------------- git's config syntax


_KEY_CHARS = re.compile(r"[A-Za-z0-9-]")
# Anything that looks like a filter or merge section, wherever it stands (a value, a comment): a name too
# many is harmless, one missed is not.
_LOOSE_SECTION = re.compile(r"\[\s*(filter|merge)\s*(?:\"((?:[^\"\\\n]|\\.)*)\"|\.([^\]\n]*))\s*\]", re.IGNORECASE)


def parse_config(text: str, directory: str) -> tuple[set[str], set[str], list[str]]:
    """The filter and merge driver names a config file defines, and the files it includes (any condition),
    as git 2.39's config parser reads it (config.c: parse_file, get_base_var, parse_value)."""
    filters: set[str] = set()
    merges: set[str] = set()
    includes: list[str] = []
    for section, subsection, key, value in _entries(text):
        if subsection is None:
            if section == "include" and key == "path" and value:
                includes.append(_include_path(value, directory))
            continue
        if section == "filter":
            filters.add(subsection)
        elif section == "merge":
            merges.add(subsection)
        elif section == "includeif" and key == "path" and value:
            includes.append(_include_path(value, directory))
    for match in _LOOSE_SECTION.finditer(text):
        name = match.group(2) if match.group(2) is not None else match.group(3)
        unescaped = re.sub(r"\\(.)", r"\1", name) if match.group(2) is not None else name.lower()
        (filters if match.group(1).lower() == "filter" else merges).update({unescaped, name})
    return filters, merges, includes


def _include_path(value: str, directory: str) -> str:
    path = os.path.expanduser(value)
    return path if os.path.isabs(path) else os.path.join(directory, path)


def _entries(text: str) -> Iterator[tuple[str, str | None, str, str | None]]:
    """(section, subsection, key, value) of each entry; stops where git would stop with a syntax error."""
    text = text.replace("\r\n", "\n").removeprefix("\ufeff")
    length, position = len(text), 0
    section, subsection = "", None
    while position < length:
        char = text[position]
        position += 1
        if char in "#;":
            position = _line_end(text, position)
        elif char.isspace():
            continue
        elif char == "[":
            header = _header(text, position)
            if header is None:
                return
            section, subsection, position = header
        elif char.isalpha() and char.isascii():
            start = position - 1
            while position < length and _KEY_CHARS.match(text[position]):
                position += 1
            key = text[start:position].lower()
            while position < length and text[position] in " \t":
                position += 1
            value = None
            if position < length and text[position] == "=":
                value, position = _value(text, position + 1)
                if value is None:
                    return
            elif position < length and text[position] != "\n":
                return
            yield section, subsection, key, value
        else:
            return


def _line_end(text: str, position: int) -> int:
    end = text.find("\n", position)
    return len(text) if end < 0 else end + 1


def _header(text: str, position: int) -> tuple[str, str | None, int] | None:
    """`[section]`, `[section "sub"]` or the old `[section.sub]`; None on a syntax error."""
    start = position
    while position < len(text) and (_KEY_CHARS.match(text[position]) or text[position] == "."):
        position += 1
    if position >= len(text):
        return None
    name = text[start:position].lower()
    if text[position] == "]":
        section, _, sub = name.partition(".")
        return section, (sub if _ else None), position + 1
    if not text[position].isspace():
        return None
    while position < len(text) and text[position].isspace():
        if text[position] == "\n":
            return None
        position += 1
    if position >= len(text) or text[position] != '"':
        return None
    position += 1
    sub_chars = []
    while position < len(text):
        char = text[position]
        position += 1
        if char == "\n":
            return None
        if char == '"':
            break
        if char == "\\":
            if position >= len(text) or text[position] == "\n":
                return None
            char = text[position]
            position += 1
        sub_chars.append(char)
    else:
        return None
    if position >= len(text) or text[position] != "]":
        return None
    # `[filter.a "b"]` is git's `filter.a.b`: the section ends at the first dot, the rest joins the subsection.
    section, dot, rest = name.partition(".")
    return section, (f"{rest}.{''.join(sub_chars)}" if dot else "".join(sub_chars)), position + 1


def _value(text: str, position: int) -> tuple[str | None, int]:
    """A value as parse_value reads it: quotes, escapes, comments, continued lines, inner spaces kept."""
    out: list[str] = []
    quote = comment = False
    spaces = 0
    escapes = {"t": "\t", "b": "\b", "n": "\n", "\\": "\\", '"': '"'}
    while True:
        if position >= len(text):
            return (None if quote else "".join(out)), position
        char = text[position]
        position += 1
        if char == "\n":
            return (None if quote else "".join(out)), position
        if comment:
            continue
        if char.isspace() and not quote:
            spaces += 1 if out else 0
            continue
        if not quote and char in ";#":
            comment = True
            continue
        out.extend(" " * spaces)
        spaces = 0
        if char == "\\":
            following = text[position] if position < len(text) else "\n"
            position += 1
            if following == "\n":
                continue
            if following not in escapes:
                return None, position
            out.append(escapes[following])
        elif char == '"':
            quote = not quote
        else:
            out.append(char)


# ---------------------------------------------------------------- the index's gitlinks


def _index_gitlinks(index: str) -> list[str]:
    """The paths an index file holds as gitlinks (mode 160000), its shared index's too (split index).
    Read only when the mode's bytes occur at all, which they almost never do by chance."""
    try:
        data = read_capped(index, MAX_INDEX_BYTES)
    except (OSError, ValueError):
        return []
    if GITLINK_MODE not in data:
        return []
    for hash_size in (20, 32):
        links = _parse_index(data, hash_size)
        if links is not None:
            shared = _shared_index(data, os.path.dirname(index))
            return links + (_index_gitlinks(shared) if shared is not None else [])
    return _gitlinks_by_walk(index)


def _parse_index(data: bytes, hash_size: int) -> list[str] | None:
    """Gitlink paths of a DIRC v2/v3/v4 index; None when the bytes do not parse with this hash size."""
    if data[:4] != b"DIRC" or len(data) < 12:
        return None
    version, count = int.from_bytes(data[4:8], "big"), int.from_bytes(data[8:12], "big")
    if version not in (2, 3, 4):
        return None
    position, previous, links = 12, b"", []
    fixed = 40 + hash_size + 2
    try:
        for _ in range(count):
            mode = int.from_bytes(data[position + 24:position + 28], "big")
            flags = int.from_bytes(data[position + fixed - 2:position + fixed], "big")
            header = fixed + (2 if version >= 3 and flags & 0x4000 else 0)
            name_start = position + header
            if version == 4:
                strip, name_start = _varint(data, name_start)
                end = data.index(b"\0", name_start)
                if strip > len(previous):
                    return None
                name = previous[:len(previous) - strip] + data[name_start:end]
                position = end + 1
            else:
                end = data.index(b"\0", name_start)
                name = data[name_start:end]
                position += (header + len(name) + 8) & ~7
            previous = name
            if mode == 0o160000:
                links.append(os.fsdecode(name))
            if position > len(data):
                return None
    except (ValueError, IndexError):
        return None
    return links


def _varint(data: bytes, position: int) -> tuple[int, int]:
    byte = data[position]
    position += 1
    value = byte & 127
    while byte & 128:
        byte = data[position]
        position += 1
        value = ((value + 1) << 7) | (byte & 127)
    return value, position


def _shared_index(data: bytes, directory: str) -> str | None:
    """The `sharedindex.<hash>` a split index's `link` extension names."""
    at = data.rfind(b"link")
    if at < 0 or at + 8 > len(data):
        return None
    size = int.from_bytes(data[at + 4:at + 8], "big")
    if size not in (20, 32) and size < 20:
        return None
    digest = data[at + 8:at + 8 + (32 if size >= 32 else 20)].hex()
    shared = os.path.join(directory, f"sharedindex.{digest}")
    return shared if os.path.isfile(shared) else None


def _gitlinks_by_walk(index: str) -> list[str]:
    """An index that does not parse (a format this reader does not know): every directory holding a `.git`
    under the worktree counts, so that none is missed."""
    gitdir = os.path.dirname(index)
    pointer = _gitfile_pointer(os.path.join(gitdir, "gitdir"))
    top = (os.path.dirname(pointer) if pointer is not None
           else os.path.dirname(gitdir) if os.path.basename(gitdir) == ".git" else None)
    if top is None:
        return []
    found: list[str] = []
    for directory, dirnames, filenames in os.walk(top):
        if directory != top and (".git" in dirnames or ".git" in filenames):
            found.append(os.path.relpath(directory, top))
        dirnames[:] = [name for name in dirnames if name != ".git"]
    return found
