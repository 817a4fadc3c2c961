"""A PostgreSQL schema of its own for a test that needs a second store URL beside `store_url`
(tests/conftest.py): made in the `test` database on 127.0.0.1:5432, dropped after."""

from __future__ import annotations

import uuid
from typing import Iterator

PG_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=test"


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
