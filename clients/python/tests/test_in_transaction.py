"""``run_once(..., connection=conn)`` with psycopg 3: the work's row and the
record's SUCCEEDED committed together, against the real server, with an
application table in the coordinator's own database."""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator, List, Optional

import grpc
import psycopg
import pytest

from harness import Database, Server
from helpers import wait_until
from idempotency_coordinator import Client, LeaseContext, LeaseLost, RunResult, pb, pb_grpc


@pytest.fixture
def client(server: Server) -> Iterator[Client]:
    assert server.addr
    with Client.connect(server.addr) as c:
        yield c


@pytest.fixture
def orders(database: Database) -> Iterator[str]:
    """An application table of the test's own, in the coordinator's database."""
    table = "orders_" + uuid.uuid4().hex[:12]
    with psycopg.connect(database.url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (order_key text NOT NULL, placed_by text NOT NULL)")
    yield table
    with psycopg.connect(database.url, autocommit=True) as conn:
        conn.execute(f"DROP TABLE {table}")


def placed(database: Database, table: str, key: str) -> List[str]:
    with psycopg.connect(database.url) as conn:
        rows = conn.execute(f"SELECT placed_by FROM {table} WHERE order_key = %s", (key,)).fetchall()
    return [row[0] for row in rows]


def test_fifty_concurrent_callers_insert_one_row_and_all_get_its_result(
    client: Client, database: Database, orders: str, scope: str, key: str
) -> None:
    def caller(i: int) -> RunResult[str]:
        with psycopg.connect(database.url) as conn:
            with conn.transaction():

                def work(ctx: LeaseContext) -> str:
                    conn.execute(f"INSERT INTO {orders} VALUES (%s, %s)", (key, f"caller-{i}"))
                    return f"order placed by caller-{i}"

                result: RunResult[str] = client.run_once(scope, key, work, connection=conn, wait=30)
            return result

    with ThreadPoolExecutor(max_workers=50) as pool:
        results = list(pool.map(caller, range(50)))

    rows = placed(database, orders, key)
    assert len(rows) == 1, rows
    assert sum(1 for r in results if not r.replayed) == 1
    assert {r.value for r in results} == {f"order placed by {rows[0]}"}
    assert client.get(scope, key).status == pb.STATUS_SUCCEEDED


def test_a_holder_whose_lease_was_taken_over_cannot_commit_its_row(
    client: Client, server: Server, database: Database, orders: str, scope: str, key: str
) -> None:
    inserted = threading.Event()
    resume = threading.Event()
    outcome: List[BaseException] = []

    def holder() -> None:
        with psycopg.connect(database.url) as conn:

            def work(ctx: LeaseContext) -> str:
                conn.execute(f"INSERT INTO {orders} VALUES (%s, 'A')", (key,))
                inserted.set()
                resume.wait(30)
                return "from A"

            try:
                client.run_once(scope, key, work, connection=conn, lease_ttl=1, heartbeat=False)
            except LeaseLost as err:
                outcome.append(err)
            conn.commit()

    a = threading.Thread(target=holder)
    a.start()
    assert inserted.wait(10)
    assert server.addr
    with grpc.insecure_channel(server.addr) as ch:
        stub = pb_grpc.CoordinatorStub(ch)

        def take_over() -> Optional[pb.AcquireResponse]:
            resp = stub.Acquire(pb.AcquireRequest(scope=scope, key=key, request_id=uuid.uuid4().hex), timeout=5)
            return resp if resp.decision == pb.DECISION_PROCEED else None

        b: pb.AcquireResponse = wait_until(take_over, 15, "B to take the lease over")
        stub.Complete(
            pb.CompleteRequest(
                scope=scope,
                key=key,
                lease_token=b.lease.token,
                success=pb.Success(result=b'"from B"', content_type="application/json"),
            ),
            timeout=5,
        )
    resume.set()
    a.join(30)
    assert len(outcome) == 1 and isinstance(outcome[0], LeaseLost), outcome
    assert placed(database, orders, key) == []
    assert client.get(scope, key).result.result == b'"from B"'
