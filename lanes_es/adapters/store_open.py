"""Opening the event store: which store, and why it cannot be used, said before anything is written.

Each check turns a condition a user can fix into a `StoreError` naming the store, the cause
and the next step: a directory or a foreign file where the store should be (never created
over), a read-only store for a command that writes, the PostgreSQL extra missing, a server
that refuses or does not answer within CONNECT_TIMEOUT seconds, a refused login.
Read-only commands open an existing SQLite store read-only, so they work on a read-only disk.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import quote

CONNECT_TIMEOUT = 5  # seconds: a store that does not answer fails fast, not after the driver's 30 s
SQLITE_HEADER = b"SQLite format 3\x00"
POSTGRES_EXTRA = "pip install 'lanes-es[postgres]' (from a checkout: pip install -e '.[postgres]')"
VERIFY_HINT = "`lanes-es verify BATCH_ID` lists what is damaged"


def store_failure(url: str, cause: str, read_only: bool = False, outage: bool = False) -> Exception:
    from lanes_es.adapters.store import StoreError, StoreOutage, StoreReadOnly

    kind = StoreOutage if outage else StoreReadOnly if read_only else StoreError
    return kind(f"the event store {shown_url(url)} {cause}")


def shown_url(url: str) -> str:
    """The store URL as a message shows it: a PostgreSQL password never reaches a terminal or a log."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # a URL urllib cannot read (an unclosed IPv6 bracket): hide what stands before the host
        return re.sub(r"(//[^/@:]*:)[^/@]*@", r"\1***@", url)
    if password is None:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@", 1)))


def sqlite_database(path: str, read_only: bool, make: bool = True) -> str:
    """The SQLite database name to open for `path`, after refusing what is not a lanes-es store. `make` False:
    a writer's store that does not exist yet is checked (its place writable) but not made (`make_sqlite_store`,
    at its first append)."""
    if not path.strip():
        raise store_failure(repr(path), "names no file; give a path with --store or LANES_ES_STORE, or unset it for "
                                        "the repository's own store")
    store = Path(path)
    if store.is_dir():
        raise store_failure(path, f"is a directory; name a file, e.g. --store {store / 'events.sqlite'}")
    if store.exists():
        _refuse_foreign(store)
        if read_only and not _writable(store):
            return _read_only_uri(store)
    elif read_only:
        return ":memory:"  # nothing recorded yet; a read-only command creates no store
    if not read_only:
        _require_writable(store)
        if make and not store.exists():
            make_sqlite_store(store)
    return path


def make_sqlite_store(store: Path) -> None:
    """Make the SQLite store at `store` (and its directory); one another command made meanwhile is kept."""
    try:
        store.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise store_failure(str(store), f"cannot be made: {error.strerror} for {error.filename}") from None
    if not store.exists():
        _make_store_file(store)
    else:  # made by another command meanwhile: its header read now, before this process opens a connection to it
        _refuse_foreign(store)


def parsed_store_url(url: str) -> Any:
    """`urlparse(url)`, its port read once: a URL urllib cannot read (an unclosed IPv6 bracket, a port out of
    range or not a number) is the user's to fix, said as such."""
    from urllib.parse import urlparse

    try:
        parsed = urlparse(url)
        parsed.port  # noqa: B018 - urllib checks the port only when it is read
    except ValueError as error:
        from lanes_es.adapters.store import StoreError

        raise StoreError(f"invalid store URL {shown_url(url)}: {error}; write postgresql://USER@HOST:PORT/DB (a port "
                         f"of 1 to 65535, an IPv6 host in brackets) with --store or LANES_ES_STORE") from None
    return parsed


def refuse_unmade_place(url: str, checkout: Path) -> None:
    """A SQLite store named by --store or LANES_ES_STORE is made only in a directory that exists: a typo in
    the path makes no folders (and a later command with the path right would find no batch); and never in
    the coordinator's working tree, which it would make dirty (every tick would refuse it)."""
    from urllib.parse import unquote

    parsed = parsed_store_url(url)
    if url == "memory:" or parsed.scheme not in ("", "sqlite"):
        return
    path = unquote(parsed.path) if parsed.scheme == "sqlite" else url
    if not path.strip():
        return  # sqlite_database names it
    directory = Path(path).absolute().parent
    if not directory.exists():
        raise store_failure(url, f"would be made in {directory}, which does not exist; create it (mkdir -p "
                                 f"{directory}) or fix the path given with --store or LANES_ES_STORE")
    place, top = directory.resolve() / Path(path).name, checkout.resolve()
    if top in place.parents and (top / ".git") not in (place, *place.parents):
        raise store_failure(url, f"is inside the coordinator checkout {top}, where it would be an untracked file "
                                 f"every tick refuses; put it outside (e.g. --store {top.parent / 'events.sqlite'}) "
                                 f"or leave --store and LANES_ES_STORE unset for the repository's own store")


def full_disk(url: str, error: BaseException) -> str | None:
    """SQLite's words for a full disk ("database or disk is full"; "disk I/O error" when its -wal or -shm file
    cannot grow), as the cause and the next step; None for any other error."""
    text = str(error)
    if "disk is full" not in text and "disk I/O error" not in text:
        return None
    try:
        disk = os.statvfs(Path(url).absolute().parent)
        free: int | None = disk.f_bavail * disk.f_frsize
    except OSError:
        free = None
    if "disk is full" not in text and (free is None or free > 1024 * 1024):
        return None
    return (f"the disk holding it is full ({text}; {free if free is not None else '?'} bytes free); nothing was "
            f"appended, the log keeps every step before this: free some space and run the command again")


_HEADERS_READ: set[str] = set()


def _refuse_foreign(store: Path) -> None:
    """Read the header once per process: closing any descriptor of a SQLite file drops the POSIX locks the
    process's open connections hold on it (the steward's lease renews from a thread), so never again later."""
    if str(store) in _HEADERS_READ:
        return
    _HEADERS_READ.add(str(store))
    try:
        with open(store, "rb") as handle:
            header = handle.read(len(SQLITE_HEADER))
    except OSError as error:
        raise store_failure(str(store), f"cannot be read ({error.strerror}); check its owner and mode") from None
    if not header:
        raise store_failure(str(store), "is an empty file (0 bytes), not a lanes-es store; it is not re-created over: "
                                        "restore it from a backup, or move it away to start a new store")
    if header != SQLITE_HEADER:
        raise store_failure(str(store), "is not a SQLite file (a foreign file where the store should be); it is "
                                        "left as it is: name the right file with --store, or move this one away")


def _writable(store: Path) -> bool:
    return os.access(store, os.W_OK) and os.access(store.parent, os.W_OK)


def _require_writable(store: Path) -> None:
    directory = store.parent
    while not directory.exists() and directory != directory.parent:
        directory = directory.parent
    if directory.is_file() or not os.access(directory, os.W_OK) or (store.exists() and not os.access(store, os.W_OK)):
        raise store_failure(str(store), "is read-only (its file or directory cannot be written); this command writes "
                                        "to it: use a writable --store, or ask its owner. Read-only commands "
                                        "(status, plan, replay, verify, export, audit, batches, flakes) still work "
                                        "on it", read_only=True)


def _make_store_file(store: Path) -> None:
    """A new store appears whole: made under a temporary name with its SQLite header (WAL mode) and linked
    into place. The driver would make an empty file first and write its header later, so a second command
    started at the same moment saw 0 bytes and refused them as not a store; a link that finds the store made
    by another command leaves that one standing."""
    import sqlite3
    import uuid

    temporary = store.with_name(f".{store.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
    try:
        connection = sqlite3.connect(temporary)
        try:
            connection.execute("PRAGMA journal_mode=WAL")
        finally:
            connection.close()
        try:
            os.link(temporary, store)
        except FileExistsError:
            pass
    except (OSError, sqlite3.Error) as error:
        raise store_failure(str(store), f"cannot be made: {error}") from None
    finally:
        for leftover in (temporary, Path(f"{temporary}-wal"), Path(f"{temporary}-shm")):
            leftover.unlink(missing_ok=True)
    _HEADERS_READ.add(str(store))


def _read_only_uri(store: Path) -> str:
    """A store on a read-only disk: WAL needs its -shm file, so open it immutable when no WAL is pending."""
    pending = Path(f"{store}-wal")
    mode = "mode=ro" if pending.exists() and pending.stat().st_size else "immutable=1"
    return f"file:{quote(str(store.resolve()))}?{mode}"


# ---------------------------------------------------------------- PostgreSQL


def probe_postgres(url: str, env: dict[str, str], log_table: str, writes: bool) -> tuple[bool, bool]:
    """One direct connection with a short timeout, so the cause is the server's own words: whether the
    schema holds `log_table` (a read-only command makes no table: without it the store is empty), and
    whether this role may create in the schema (else a read-only command folds the read model in memory).
    The store is remembered as this process's, for a refused privilege later (`privilege_refusal`)."""
    _OPENED_POSTGRES[:] = [(url, env, writes)]
    try:
        import psycopg
    except ImportError:
        raise store_failure(url, f"needs the PostgreSQL extra, which is not installed: {POSTGRES_EXTRA}") from None
    try:
        connection = psycopg.connect(host=env["POSTGRES_HOST"], port=env["POSTGRES_PORT"],
                                     user=env["POSTGRES_USER"], password=env["POSTGRES_PASSWORD"] or None,
                                     dbname=env["POSTGRES_DBNAME"], connect_timeout=CONNECT_TIMEOUT)
    except psycopg.Error as error:
        raise store_failure(url, postgres_cause(str(error), env, writes),
                            outage=lost_connection(error) is not None) from None
    try:
        name = '"{0}"."{1}"'.format(env["POSTGRES_SCHEMA"].replace('"', '""'), log_table)
        row = connection.execute(_PROBE, {"log": name, "schema": env["POSTGRES_SCHEMA"]}).fetchone()
    except psycopg.Error as error:
        raise store_failure(url, postgres_cause(str(error), env, writes)) from None
    finally:
        connection.close()
    has_log, may_create, may_append = bool(row and row[0]), bool(row and row[1] is not False), bool(row and row[2])
    # Refused before the command does anything, not at its first append (a new store is made there).
    if writes and has_log and not may_append:
        raise store_failure(url, privilege_cause(f"permission denied to append to table {log_table}", env, writes))
    if writes and not has_log and row and row[1] is None:
        raise store_failure(url, missing_schema_cause(env))
    if writes and not has_log and not may_create:
        raise store_failure(url, privilege_cause(f"permission denied for schema {env['POSTGRES_SCHEMA']}", env, writes,
                                                 new_store=True))
    return has_log, may_create


def missing_schema_cause(env: dict[str, Any]) -> str:
    return (f"names schema {env['POSTGRES_SCHEMA']}, which database {env['POSTGRES_DBNAME']} does not have: create it "
            f"(CREATE SCHEMA {env['POSTGRES_SCHEMA']} AUTHORIZATION {env['POSTGRES_USER']}) or fix ?schema= in the URL")


# Whether the log table is there, whether the role may create in the schema, and whether it may append to the
# log: INSERT, the UPDATE that PostgreSQL asks of eventsourcing's LOCK TABLE ... EXCLUSIVE, and the sequence
# that numbers the notifications.
_PROBE = ("SELECT to_regclass(%(log)s) IS NOT NULL, "
          "(SELECT has_schema_privilege(oid, 'CREATE') FROM pg_namespace WHERE nspname = %(schema)s), "
          "CASE WHEN to_regclass(%(log)s) IS NOT NULL THEN has_table_privilege(%(log)s, 'INSERT') "
          "AND has_table_privilege(%(log)s, 'UPDATE') "
          "AND has_sequence_privilege(pg_get_serial_sequence(%(log)s, 'notification_id'), 'USAGE') END")


def postgres_cause(message: str, env: dict[str, Any], writes: bool = False, new_store: bool = False) -> str:
    where = f"{env['POSTGRES_HOST']}:{env['POSTGRES_PORT']}"
    text = message.lower()
    if _refused_privilege(text):
        return privilege_cause(message, env, writes, new_store)
    if "connection refused" in text:
        return f"refused the connection: no PostgreSQL listens on {where}; start it, or fix host and port in the URL"
    if "timeout" in text or "timed out" in text:
        return f"did not answer within {CONNECT_TIMEOUT} s at {where}; check the host, the port and the network"
    if "password" in text or "authentication" in text or ("role" in text and "does not exist" in text):
        return (f"refused the login of user {env['POSTGRES_USER']} (authentication): fix the user or password in the "
                f"URL, postgresql://USER:PASSWORD@HOST:PORT/DB")
    if "database" in text and "does not exist" in text:
        return f"has no database {env['POSTGRES_DBNAME']} on {where}: create it (createdb) or name another in the URL"
    first_line = message.strip().splitlines()[0] if message.strip() else "connection failed"
    return f"cannot be reached at {where}: {first_line}"


# A role may log in and still lack the grants a command needs (SQLSTATE 42501, insufficient_privilege):
# PostgreSQL says "permission denied for table/schema X" or "must be owner of table X".
INSUFFICIENT_PRIVILEGE = "42501"
INVALID_SCHEMA_NAME = "3F000"
_OPENED_POSTGRES: list[tuple[str, dict[str, str], bool]] = []  # (url, env, writes) of the store this process opened


def _refused_privilege(text: str) -> bool:
    return "permission denied" in text or "must be owner of" in text


def privilege_cause(message: str, env: dict[str, Any], writes: bool, new_store: bool = False) -> str:
    """Who was refused what, that nothing was written, and the grants that let the command run."""
    role, schema = env["POSTGRES_USER"], env["POSTGRES_SCHEMA"]
    first = message.strip().splitlines()[0] if message.strip() else "permission denied"
    if not writes:
        need = (f"a read-only command needs GRANT USAGE ON SCHEMA {schema} TO {role} and GRANT SELECT ON ALL TABLES "
                f"IN SCHEMA {schema} TO {role}")
    elif new_store:
        need = (f"a command that makes the store needs GRANT USAGE, CREATE ON SCHEMA {schema} TO {role} (or a store "
                f"URL whose user may create there)")
    else:
        need = (f"a command that writes needs GRANT USAGE, CREATE ON SCHEMA {schema} TO {role}, GRANT SELECT, INSERT, "
                f"UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {role} (eventsourcing locks the log to number its events, "
                f"which PostgreSQL allows with UPDATE) and GRANT USAGE ON ALL SEQUENCES IN SCHEMA {schema} TO {role}, "
                f"or a store URL with the role that made the store")
    return (f"refused user {role} ({first}); nothing was written: {need}. Ask the database's owner, then run the "
            f"command again")


def privilege_refusal(error: BaseException, new_store: bool = False) -> Exception | None:
    """A PostgreSQL privilege refused anywhere under a command, as a refusal naming this process's store; None
    for any other error (or when no PostgreSQL store was opened). `new_store`: refused while making it."""
    cause = refused_privilege(error)
    if cause is None or not _OPENED_POSTGRES:
        return None
    url, env, writes = _OPENED_POSTGRES[-1]
    return store_failure(url, privilege_cause(str(cause), env, writes, new_store))


def refused_privilege(error: BaseException) -> BaseException | None:
    """The driver's insufficient_privilege error in `error`'s chain (eventsourcing wraps psycopg's), or None."""
    return _driver_error(error, INSUFFICIENT_PRIVILEGE)


def missing_schema(error: BaseException) -> bool:
    """Whether the server said the URL's schema does not exist (a writer's open: a reader sees an empty store)."""
    return _driver_error(error, INVALID_SCHEMA_NAME) is not None


def _driver_error(error: BaseException, sqlstate: str) -> BaseException | None:
    return next((cause for cause in _chain(error) if getattr(cause, "sqlstate", None) == sqlstate), None)


def _chain(error: BaseException) -> Iterator[BaseException]:
    """`error` and what caused it, outermost first (eventsourcing wraps psycopg's errors in its own)."""
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        yield cause
        cause = cause.__cause__ or cause.__context__


# ---------------------------------------------------------------- outages

# A connection the server ended or could not give: connection_exception (SQLSTATE class 08), admin_shutdown
# (pg_terminate_backend, a fast shutdown), crash_shutdown, cannot_connect_now (starting or stopping). A driver
# error without a SQLSTATE is the client's own: a refused or dropped connection, a pool that got none in time.
_LOST_CONNECTION_STATES = ("57P01", "57P02", "57P03")


def lost_connection(error: BaseException) -> BaseException | None:
    """The PostgreSQL driver's error in `error`'s chain when it says the connection was lost or never made
    (not a lock timeout, a cancelled query or a refused privilege, which have SQLSTATEs of their own)."""
    psycopg = sys.modules.get("psycopg")
    if psycopg is None:  # never imported: no PostgreSQL store in this process
        return None
    for cause in _chain(error):
        if isinstance(cause, (psycopg.OperationalError, psycopg.InterfaceError)):
            state = getattr(cause, "sqlstate", None)
            if state is None or state.startswith("08") or state in _LOST_CONNECTION_STATES:
                return cause
    return None


def server_silence(connection_kwargs: dict[str, Any]) -> str | None:
    """None when the PostgreSQL server of `connection_kwargs` answers a new connection now (within
    CONNECT_TIMEOUT), else the driver's words for why it does not."""
    import psycopg

    options = {key: value for key, value in connection_kwargs.items() if key != "row_factory"}
    try:
        psycopg.connect(**{**options, "connect_timeout": CONNECT_TIMEOUT, "autocommit": True}).close()
    except psycopg.Error as error:
        return _driver_words(error)
    return None


def outage_refusal(error: BaseException, silence: str | None = None) -> Exception | None:
    """A lost or refused connection to this process's PostgreSQL store, as a `StoreOutage` naming the store and
    the way on; None for any other error. `silence`: the server was asked again and did not answer (why)."""
    lost = lost_connection(error)
    if lost is None or not _OPENED_POSTGRES:
        return None
    from lanes_es.adapters.store import StoreOutage

    url, env, _ = _OPENED_POSTGRES[-1]
    if silence is None:
        silence = server_silence(_connection_kwargs(env))
    words = _driver_words(lost)
    return StoreOutage(f"the event store {shown_url(url)} {outage_cause(words, env, silence)}", store=shown_url(url),
                       reason=silence or words)


def outage_cause(words: str, env: dict[str, Any], silence: str | None) -> str:
    """What a lost connection means, by whether the server answers a new one (`silence` None) or not."""
    where = f"{env['POSTGRES_HOST']}:{env['POSTGRES_PORT']}"
    if silence is None:
        return (f"lost its connection to the PostgreSQL server at {where} ({words}); the server answers again, the "
                f"log keeps every step already taken and nothing more was written: run the command again")
    return (f"does not answer at {where} ({silence}): the PostgreSQL server is down or unreachable, an outage of "
            f"the store, not damage to its log; the log keeps every step already taken and nothing more was "
            f"written: run the command again once the server is back")


def _connection_kwargs(env: dict[str, Any]) -> dict[str, Any]:
    return {"host": env["POSTGRES_HOST"], "port": env["POSTGRES_PORT"], "user": env["POSTGRES_USER"],
            "password": env["POSTGRES_PASSWORD"] or None, "dbname": env["POSTGRES_DBNAME"]}


def _driver_words(error: BaseException) -> str:
    """The driver's reason in short: "connection failed: connection to server at ..., port ... failed: Connection
    refused" -> "Connection refused" (the message names the server already)."""
    text = str(error).strip()
    first = text.splitlines()[0] if text else ""
    return first.rsplit(": ", 1)[-1] or type(error).__name__


# ---------------------------------------------------------------- the repository's id

REPOSITORY_ID_FILE = "repository-id"
_REPOSITORY_ID = re.compile(r"[0-9a-f]{32}")


def repository_id(common_dir: Path, create: bool) -> str | None:
    """This clone's id in a shared store, made on first use at `<git common dir>/lanes-es/repository-id`.

    It keys the clone's Initiatives (lanes_es/domain/initiative.py). A clone of the same project
    elsewhere gets its own (it has its own batch branch and Lanes), while every worktree of this
    clone reads this one, and it moves with the repository. `create` False (read-only commands):
    None when none was made yet, and then this clone has no Initiative keyed by it.
    """
    path = common_dir / "lanes-es" / REPOSITORY_ID_FILE
    if not path.exists() and create:
        _make_repository_id(path)
    from lanes_es.adapters.files import FileTooLarge, read_capped_text

    try:
        text = read_capped_text(path, 4096, "ascii").strip()
    except FileNotFoundError:
        return None
    except FileTooLarge:
        text = ""  # far more than an id: refused below as one edited outside lanes-es
    except (OSError, UnicodeDecodeError) as error:
        raise _id_failure(path, f"cannot be read ({error}); check its owner and mode") from None
    if not _REPOSITORY_ID.fullmatch(text):
        raise _id_failure(path, "is not 32 hex digits: it was edited outside lanes-es; restore it from a backup "
                                "(this repository's Initiatives in the store are keyed by it)")
    return text


class RepositoryIdToMake:
    """This clone's id while it has none: made when the clone's first Initiative is (`EventStore`), right before
    the first append of its first confirmation, so that a command refused before it records anything leaves no
    id behind. Until then it is read again at each use, so an id another command made meanwhile is the one used;
    two first confirmations at once agree on one id (the link in `repository_id`)."""

    def __init__(self, common_dir: Path) -> None:
        self.common_dir = common_dir

    def found(self) -> str | None:
        return repository_id(self.common_dir, create=False)

    def make(self) -> str | None:
        return repository_id(self.common_dir, create=True)


def _id_failure(path: Path, cause: str) -> Exception:
    from lanes_es.adapters.store import StoreError

    return StoreError(f"this repository's id {path} {cause}")


def _make_repository_id(path: Path) -> None:
    """Written whole to a temporary file and linked into place: two first commands at once agree on one id."""
    import uuid

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{REPOSITORY_ID_FILE}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
        temporary.write_text(uuid.uuid4().hex + "\n", encoding="ascii")
        try:
            os.link(temporary, path)  # fails when another process linked its id first: that one stands
        except FileExistsError:
            pass
        finally:
            temporary.unlink()
    except OSError as error:
        raise _id_failure(path, f"cannot be made: {error.strerror}; make the directory writable") from None
