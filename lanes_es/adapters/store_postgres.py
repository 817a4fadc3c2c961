"""eventsourcing's PostgreSQL persistence, with retries that go on only while the server answers.

eventsourcing retries a read or an append whose connection failed (ten attempts, 0.2 s apart), and
its pool waits up to POSTGRES_CONNECT_TIMEOUT for a connection each time. That rides out a
connection the server ended (`pg_terminate_backend`, a restart): the pool drops the dead connection,
the idle ones are checked (the server usually ended them together), and the retry gets a live one. With the server down it made a command wait some 40 s and then say
"couldn't get a connection". Here a lost connection asks the server once for a new one: when it
answers, eventsourcing's retry goes on; when it does not, the command stops at once with a
`StoreOutage` that names the server (lanes_es/adapters/store_open.py words it).

A module of its own because eventsourcing.postgres imports psycopg, which only the `postgres`
extra installs: the store names this factory by topic, so the embedded default never imports it.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

from eventsourcing.persistence import InterfaceError, OperationalError
from eventsourcing.postgres import PostgresDatastore, PostgresFactory

from lanes_es.adapters.store_open import lost_connection, outage_refusal, server_silence


class AnsweringPostgresDatastore(PostgresDatastore):
    @contextmanager
    def get_connection(self) -> Iterator[Any]:
        try:
            with super().get_connection() as connection:
                yield connection
        except (InterfaceError, OperationalError) as error:
            if lost_connection(error) is not None:
                silence = server_silence(self.pool.kwargs)
                outage = outage_refusal(error, silence) if silence is not None else None
                if outage is not None:
                    raise outage from None
                # The server answers: the idle connections it ended with this one are dropped too, so that
                # eventsourcing's retry takes a live (or new) one rather than the next dead one.
                self.pool.check()
            raise


class PostgresStoreFactory(PostgresFactory):
    def __init__(self, env: Any) -> None:
        super().__init__(env)
        # The datastore eventsourcing built from the environment, with the get_connection above (it adds
        # no state, so its class is switched rather than a second pool built from the same settings).
        self.datastore.__class__ = AnsweringPostgresDatastore
