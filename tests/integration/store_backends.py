"""A store URL on each backend, until the suite's shared `store_url` fixture lands (issue 12, i12a).

SQLite: a file in the test's tmp_path. PostgreSQL: a schema of the `test` database on
127.0.0.1:5432 made for the test and dropped after it.
"""

from __future__ import annotations

import uuid
from typing import Iterator

import pytest

PG_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=test"


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:
    if request.param == "sqlite":
        yield str(tmp_path / "store" / "events.sqlite")
        return
    yield from postgres_schema_url()


def postgres_schema_url() -> Iterator[str]:
    import psycopg

    schema = f"lanes_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_DSN, autocommit=True) as connection:
        connection.execute(f"CREATE SCHEMA {schema}")
    try:
        yield f"postgresql://postgres@127.0.0.1:5432/test?schema={schema}"
    finally:
        with psycopg.connect(PG_DSN, autocommit=True) as connection:
            connection.execute(f"DROP SCHEMA {schema} CASCADE")
