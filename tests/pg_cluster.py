"""A PostgreSQL cluster of a test's own, on its own port: the fault tests stop it, start it and end its
backends, which they must never do to the machine's shared server.

    with own_cluster() as cluster:
        url = cluster.new_database()          # postgresql://postgres@127.0.0.1:PORT/t_...
        cluster.stop()                        # a fast shutdown, as an operator's restart begins
        cluster.start()

initdb refuses root: as root, the cluster belongs to a system user made once (`useradd`, as
tests/integration/test_user_permissions.py makes its user) and every pg_ctl runs as it (`runuser`).
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from tests.system_user import ensure_system_user

OWNER = "lanes-es-pg"


def postgres_bin() -> Path | None:
    """The newest PostgreSQL server binaries installed (Debian keeps them under /usr/lib/postgresql/N/bin)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda path: int(path.split("/")[4]))
    return Path(found[-1]).parent if found else None


class Cluster:
    def __init__(self, bin_dir: Path, place: Path, port: int, owner: str | None) -> None:
        self.bin_dir = bin_dir
        self.place = place
        self.data = place / "data"
        self.port = port
        self.owner = owner

    def _run(self, tool: str, *args: str) -> subprocess.CompletedProcess[str]:
        argv = [str(self.bin_dir / tool), *args]
        if self.owner is not None:
            argv = ["runuser", "-u", self.owner, "--", *argv]
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=self.place)

    def start(self) -> None:
        started = self._run("pg_ctl", "-D", str(self.data), "-l", str(self.place / "server.log"), "-w", "-o",
                            f"-p {self.port} -k {self.place} -c listen_addresses=127.0.0.1 -c fsync=off", "start")
        assert started.returncode == 0, started.stdout + started.stderr

    def stop(self) -> None:
        """A fast shutdown: the server ends every session and stops listening."""
        stopped = self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr

    def running(self) -> bool:
        return self._run("pg_ctl", "-D", str(self.data), "status").returncode == 0

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def sql(self, statement: str, database: str = "postgres") -> list[tuple[object, ...]]:
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname=database,
                             autocommit=True, connect_timeout=10) as connection:
            cursor = connection.execute(statement)
            return cursor.fetchall() if cursor.description else []

    def new_database(self) -> str:
        """A fresh database of its own for one test; its store URL."""
        name = f"t_{uuid.uuid4().hex[:16]}"
        self.sql(f"CREATE DATABASE {name}")
        return self.url(name)

    def postmaster_pid(self) -> int:
        return int((self.data / "postmaster.pid").read_text().splitlines()[0])


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _owner() -> str | None:
    """None when not root (initdb runs as this user); else the cluster's system user, made when missing."""
    if os.geteuid() != 0:
        return None
    ensure_system_user(OWNER)
    return OWNER


@contextmanager
def own_cluster() -> Iterator[Cluster]:
    """A new cluster in a directory of its own (in TMPDIR, which its user can reach: pytest's are root's alone)."""
    bin_dir = postgres_bin()
    if bin_dir is None:
        pytest.skip("no PostgreSQL server binaries (/usr/lib/postgresql/N/bin) to start a cluster of the test's own")
    owner = _owner()
    place = Path(tempfile.mkdtemp(prefix="lanes-es-pg-"))
    place.chmod(0o755)
    if owner is not None:
        shutil.chown(place, owner, owner)
    cluster = Cluster(bin_dir, place, _free_port(), owner)
    made = cluster._run("initdb", "-D", str(cluster.data), "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8")
    assert made.returncode == 0, made.stdout + made.stderr
    cluster.start()
    try:
        yield cluster
    finally:
        if cluster.running():
            cluster._run("pg_ctl", "-D", str(cluster.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(place, ignore_errors=True)
