from __future__ import annotations

import uuid
from typing import Iterator

import pytest

from harness import Database, Server


@pytest.fixture(scope="session")
def database() -> Iterator[Database]:
    db = Database()
    try:
        yield db
    finally:
        db.drop()


@pytest.fixture(scope="session")
def server(database: Database) -> Iterator[Server]:
    # A failed attempt's retry comes due after 100 ms (then 200 ms...).
    srv = Server(database.url, ["--backoff-base", "100ms"])
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def key() -> str:
    return "k-" + uuid.uuid4().hex


@pytest.fixture
def scope() -> str:
    return "tests.py." + uuid.uuid4().hex[:8]
