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
from idempotency_coordinator import Client, CoordinatorError, LeaseContext, LeaseLost, RunResult, pb, pb_grpc


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


def test_a_database_error_before_the_work_gives_the_lease_back_without_counting_an_attempt(
    client: Client, database: Database, scope: str, key: str
) -> None:
    ran = []
    with psycopg.connect(database.url) as conn:
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            with conn.transaction():
                with pytest.raises(psycopg.errors.DivisionByZero):
                    conn.execute("SELECT 1 / 0")
                # The outer transaction is aborted: the block is refused
                # before the work starts.
                client.run_once(scope, key, lambda ctx: ran.append(1), connection=conn)
    assert ran == []
    record = client.get(scope, key)
    assert record.status == pb.STATUS_FAILED
    assert record.attempt_count == 0
    assert record.last_error == ""


def test_a_result_over_the_limit_fails_the_key_for_good_and_leaves_no_row(
    client: Client, database: Database, orders: str, scope: str, key: str
) -> None:
    with psycopg.connect(database.url) as conn:

        def work(ctx: LeaseContext) -> str:
            conn.execute(f"INSERT INTO {orders} VALUES (%s, 'too big')", (key,))
            return "x" * (1024 * 1024 + 1)

        with pytest.raises(CoordinatorError) as refused:
            client.run_once(scope, key, work, connection=conn)
    assert refused.value.reason == "RESULT_REFUSED"
    assert placed(database, orders, key) == []
    record = client.get(scope, key)
    assert record.status == pb.STATUS_FAILED_PERMANENT
    assert record.attempt_count == 1


def test_a_wrong_tenant_is_named_and_the_lease_given_back(
    client: Client, database: Database, orders: str, scope: str, key: str
) -> None:
    with psycopg.connect(database.url) as conn:

        def work(ctx: LeaseContext) -> str:
            conn.execute(f"INSERT INTO {orders} VALUES (%s, 'wrong tenant')", (key,))
            return "placed"

        with pytest.raises(CoordinatorError) as refused:
            client.run_once(scope, key, work, connection=conn, tenant="someone-else")
    assert refused.value.reason == "RECORD_NOT_FOUND"
    assert '"someone-else"' in refused.value.message
    assert placed(database, orders, key) == []
    record = client.get(scope, key)
    assert record.status == pb.STATUS_FAILED
    assert record.attempt_count == 0


def test_tenant_or_schema_without_a_connection_is_refused(client: Client, scope: str, key: str) -> None:
    ran = []
    with pytest.raises(TypeError, match="only with connection="):
        client.run_once(scope, key, lambda ctx: ran.append(1), tenant="someone-else")
    with pytest.raises(TypeError, match="only with connection="):
        client.run_once(scope, key, lambda ctx: ran.append(1), schema="idempotency")
    assert ran == []
    with pytest.raises(CoordinatorError) as missing:
        client.get(scope, key)
    assert missing.value.code == grpc.StatusCode.NOT_FOUND
