"""The acceptance list of clients/README.md, with the blocking Client."""

from __future__ import annotations

import datetime
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator, List

import grpc
import pytest

from harness import Server
from helpers import DropFirstAcquireReply, wait_until
from idempotency_coordinator import (
    BytesCodec,
    Client,
    Conflict,
    CoordinatorError,
    Exhausted,
    InProgress,
    LeaseContext,
    LeaseLost,
    PermanentError,
    RetryLater,
    TransientError,
    current_lease,
    idempotent,
    pb,
    pb_grpc,
)


@pytest.fixture
def client(server: Server) -> Iterator[Client]:
    assert server.addr
    with Client.connect(server.addr) as c:
        yield c


@pytest.fixture
def stub(server: Server) -> Iterator[pb_grpc.CoordinatorStub]:
    assert server.addr
    with grpc.insecure_channel(server.addr) as ch:
        yield pb_grpc.CoordinatorStub(ch)


def acquire_until_proceed(
    stub: pb_grpc.CoordinatorStub, scope: str, key: str, timeout: float = 15.0
) -> pb.AcquireResponse:
    """A bare Acquire, repeated until it is granted a lease (with a deadline)."""

    def attempt() -> Any:
        resp = stub.Acquire(pb.AcquireRequest(scope=scope, key=key, request_id=uuid.uuid4().hex), timeout=5)
        return resp if resp.decision == pb.DECISION_PROCEED else None

    resp: pb.AcquireResponse = wait_until(attempt, timeout, "the other caller to take over")
    return resp


def test_first_call_runs_and_second_replays(client: Client, scope: str, key: str) -> None:
    runs: List[int] = []

    def work(ctx: LeaseContext) -> dict[str, Any]:
        runs.append(ctx.attempt)
        assert ctx.fencing_token > 0 and ctx.token
        assert current_lease() is ctx
        return {"charged": 1250, "currency": "EUR"}

    first = client.run_once(scope, key, work)
    assert not first.replayed and first.fresh
    assert first.value == {"charged": 1250, "currency": "EUR"}
    assert first.lease is not None and first.lease.attempt == 1
    assert first.record.status == pb.STATUS_SUCCEEDED
    assert first.record.result.content_type == "application/json"

    second = client.run_once(scope, key, work)
    assert second.replayed
    assert second.value == first.value
    assert second.lease is None
    assert runs == [1]


def test_twenty_concurrent_calls_run_once(client: Client, scope: str, key: str) -> None:
    runs: List[int] = []
    lock = threading.Lock()
    start = threading.Barrier(20)

    def work(ctx: LeaseContext) -> str:
        with lock:
            runs.append(ctx.attempt)
        time.sleep(0.3)  # long enough for the others to arrive while it runs
        return f"receipt-{ctx.fencing_token}"

    def call(_: int) -> Any:
        start.wait()
        return client.run_once(scope, key, work)

    with ThreadPoolExecutor(20) as pool:
        results = list(pool.map(call, range(20)))
    assert runs == [1]
    assert len({r.value for r in results}) == 1
    assert sum(1 for r in results if not r.replayed) == 1
    assert client.get(scope, key).attempt_count == 1


def test_heartbeat_keeps_the_lease_past_its_ttl(
    client: Client, stub: pb_grpc.CoordinatorStub, scope: str, key: str
) -> None:
    seen: List[datetime.datetime] = []

    def work(ctx: LeaseContext) -> str:
        end = time.monotonic() + 5  # two and a half times the lease's TTL
        while time.monotonic() < end:
            if not seen or seen[-1] != ctx.expires_at:
                seen.append(ctx.expires_at)
            ctx.raise_if_lost()
            time.sleep(0.05)
        # Another caller is still told it is in progress: the lease is live.
        other = stub.Acquire(pb.AcquireRequest(scope=scope, key=key, request_id="other"), timeout=5)
        assert other.decision == pb.DECISION_IN_PROGRESS
        return "done"

    res = client.run_once(scope, key, work, lease_ttl=datetime.timedelta(seconds=2))
    assert res.value == "done" and not res.replayed
    assert len(seen) >= 4, seen  # extended every third of the TTL
    assert res.record.attempt_count == 1


def test_failure_leaves_the_key_retryable(client: Client, scope: str, key: str) -> None:
    attempts: List[int] = []

    def failing(ctx: LeaseContext) -> str:
        attempts.append(ctx.attempt)
        raise TransientError("card network down", retry_after=datetime.timedelta(seconds=1))

    with pytest.raises(TransientError, match="card network down"):
        client.run_once(scope, key, failing)
    with pytest.raises(RetryLater) as later:
        client.run_once(scope, key, failing)
    assert later.value.retry_after > datetime.timedelta(0)
    assert "card network down" in later.value.last_error
    assert attempts == [1]

    def succeeding(ctx: LeaseContext) -> str:
        attempts.append(ctx.attempt)
        return "ok"

    def again() -> Any:
        try:
            return client.run_once(scope, key, succeeding)
        except RetryLater:
            return None

    res = wait_until(again, 10, "the retry to come due")
    assert res.value == "ok" and not res.replayed
    assert res.lease is not None and res.lease.attempt == 2
    assert attempts == [1, 2]
    assert client.get(scope, key).attempt_count == 2


def test_backoff_of_the_server_makes_the_key_due_again(client: Client, scope: str, key: str) -> None:
    # No retry_after on the failure: the server's --backoff-base 100ms decides.
    with pytest.raises(ValueError):
        client.run_once(scope, key, lambda ctx: (_ for _ in ()).throw(ValueError("boom")))
    rec = client.get(scope, key)
    assert rec.status == pb.STATUS_FAILED and "ValueError: boom" in rec.last_error

    def again() -> Any:
        try:
            return client.run_once(scope, key, lambda ctx: ctx.attempt)
        except RetryLater:
            return None

    assert wait_until(again, 10, "the retry").value == 2


def test_permanent_failure_exhausts_the_key(client: Client, scope: str, key: str) -> None:
    class CardDeclined(PermanentError):
        pass

    with pytest.raises(CardDeclined):
        client.run_once(scope, key, lambda ctx: (_ for _ in ()).throw(CardDeclined("declined")))
    with pytest.raises(Exhausted) as ex:
        client.run_once(scope, key, lambda ctx: "never")
    assert "declined" in ex.value.last_error
    assert ex.value.record is not None and ex.value.record.status == pb.STATUS_FAILED_PERMANENT


def test_is_permanent_classifier(client: Client, scope: str, key: str) -> None:
    with pytest.raises(KeyError):
        client.run_once(
            scope, key, lambda ctx: dict[str, int]()["missing"], is_permanent=lambda e: isinstance(e, KeyError)
        )
    with pytest.raises(Exhausted):
        client.run_once(scope, key, lambda ctx: "never")


def test_taken_over_holder_is_told_and_its_late_complete_refused(
    client: Client, stub: pb_grpc.CoordinatorStub, scope: str, key: str
) -> None:
    started = threading.Event()
    holder: dict[str, Any] = {}

    def work(ctx: LeaseContext) -> str:
        holder["token"] = ctx.token
        holder["fencing"] = ctx.fencing_token
        started.set()
        holder["told"] = ctx.lost.wait(20)
        ctx.raise_if_lost()
        return "A"

    def run_a() -> None:
        try:
            holder["result"] = client.run_once(
                scope,
                key,
                work,
                lease_ttl=datetime.timedelta(seconds=1),
                heartbeat_interval=datetime.timedelta(seconds=1.5),
            )
        except BaseException as e:  # noqa: BLE001 - inspected below
            holder["error"] = e

    a = threading.Thread(target=run_a)
    a.start()
    assert started.wait(10)
    b = acquire_until_proceed(stub, scope, key)
    assert b.lease.fencing_token > holder["fencing"]
    a.join(30)
    assert not a.is_alive()
    assert holder["told"] is True
    assert isinstance(holder.get("error"), LeaseLost), holder
    assert holder["error"].reason in ("LEASE_LOST", "LEASE_EXPIRED")

    # A's late Complete (bare stub) is refused.
    with pytest.raises(grpc.RpcError) as late:
        stub.Complete(
            pb.CompleteRequest(scope=scope, key=key, lease_token=holder["token"], success=pb.Success(result=b'"A"')),
            timeout=5,
        )
    err = CoordinatorError.from_rpc_error(late.value)
    assert err.code == grpc.StatusCode.ABORTED and err.reason == "LEASE_LOST"

    # B's lease is intact and A never stored anything.
    rec = client.get(scope, key)
    assert rec.status == pb.STATUS_PROCESSING and rec.fencing_token == b.lease.fencing_token
    stub.Complete(
        pb.CompleteRequest(
            scope=scope,
            key=key,
            lease_token=b.lease.token,
            success=pb.Success(result=b'"B"', content_type="application/json"),
        ),
        timeout=5,
    )
    assert client.run_once(scope, key, lambda ctx: "never").value == "B"


def test_taken_over_without_heartbeat_complete_is_refused(
    client: Client, stub: pb_grpc.CoordinatorStub, scope: str, key: str
) -> None:
    started = threading.Event()
    taken_over = threading.Event()
    holder: dict[str, Any] = {}

    def work(ctx: LeaseContext) -> str:
        started.set()
        assert taken_over.wait(20)
        return "A"

    def run_a() -> None:
        try:
            holder["result"] = client.run_once(scope, key, work, lease_ttl=1, heartbeat=False)
        except BaseException as e:  # noqa: BLE001
            holder["error"] = e

    a = threading.Thread(target=run_a)
    a.start()
    assert started.wait(10)
    b = acquire_until_proceed(stub, scope, key)
    taken_over.set()
    a.join(30)
    assert isinstance(holder.get("error"), LeaseLost), holder
    assert holder["error"].reason == "LEASE_LOST"
    # The work ran: what it returned comes back, not stored.
    assert holder["error"].has_unrecorded_value and holder["error"].unrecorded_value == "A"
    rec = client.get(scope, key)
    assert rec.status == pb.STATUS_PROCESSING and rec.fencing_token == b.lease.fencing_token


def test_lost_reply_is_recovered_by_the_same_request_id(server: Server, scope: str, key: str) -> None:
    assert server.addr
    drop = DropFirstAcquireReply()
    channel = grpc.intercept_channel(grpc.insecure_channel(server.addr), drop)
    client = Client(channel)
    runs: List[int] = []

    def work(ctx: LeaseContext) -> str:
        runs.append(ctx.attempt)
        return "charged"

    try:
        res = client.run_once(scope, key, work)
    finally:
        channel.close()
    assert drop.acquires == 2 and len(drop.dropped) == 1
    lost = drop.dropped[0]
    assert lost.decision == pb.DECISION_PROCEED
    assert res.lease is not None
    assert res.lease.token == lost.lease.token
    assert res.lease.attempt == lost.lease.attempt == 1
    assert res.lease.fencing_token == lost.lease.fencing_token
    assert runs == [1]
    assert res.record.attempt_count == 1
    with Client.connect(server.addr) as other:
        assert other.get(scope, key).attempt_count == 1


def test_in_progress_and_conflict(client: Client, stub: pb_grpc.CoordinatorStub, scope: str, key: str) -> None:
    held = stub.Acquire(pb.AcquireRequest(scope=scope, key=key, json_payload='{"amount": 5}'), timeout=5)
    assert held.decision == pb.DECISION_PROCEED
    with pytest.raises(InProgress) as busy:
        client.run_once(scope, key, lambda ctx: "never", json_payload={"amount": 5}, wait=0)
    assert busy.value.retry_after > datetime.timedelta(0)
    with pytest.raises(Conflict) as conflict:
        client.run_once(scope, key, lambda ctx: "never", json_payload={"amount": 6}, wait=0)
    assert conflict.value.record is not None and len(conflict.value.record.fingerprint) == 64


def test_checkpoint_is_handed_to_the_next_holder(client: Client, scope: str, key: str) -> None:
    def first(ctx: LeaseContext) -> bytes:
        assert ctx.checkpoint == b""
        ctx.save_checkpoint(b"step-1")
        raise TransientError("crashed after step 1", retry_after=datetime.timedelta(0))

    with pytest.raises(TransientError):
        client.run_once(scope, key, first, codec=BytesCodec())
    res = client.run_once(scope, key, lambda ctx: ctx.checkpoint + b"+step-2", codec=BytesCodec())
    assert res.value == b"step-1+step-2"
    assert res.record.result.content_type == "application/octet-stream"
    assert client.run_once(scope, key, lambda ctx: b"never", codec=BytesCodec()).value == b"step-1+step-2"


def test_invalid_argument_is_typed(client: Client, key: str) -> None:
    ran: List[int] = []
    with pytest.raises(CoordinatorError) as bad:
        client.run_once("bad scope", key, lambda ctx: ran.append(1))
    assert bad.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert bad.value.reason == "INVALID_ARGUMENT"
    assert "scope" in [v.field for v in bad.value.field_violations]
    assert not ran


def test_decorator_runs_once_and_replays(client: Client, scope: str) -> None:
    calls: List[str] = []

    class Order:
        def __init__(self, id: str, amount: int) -> None:
            self.id, self.amount = id, amount

    @idempotent(
        client, scope=scope, key=lambda order, **_: order.id, json_payload=lambda order, **_: {"amount": order.amount}
    )
    def charge(order: Order, *, note: str = "") -> dict[str, Any]:
        lease = current_lease()
        assert lease is not None and lease.attempt == 1
        calls.append(order.id)
        return {"order": order.id, "amount": order.amount, "note": note}

    order = Order(uuid.uuid4().hex, 42)
    assert charge(order, note="first") == {"order": order.id, "amount": 42, "note": "first"}
    assert charge(order, note="second") == {"order": order.id, "amount": 42, "note": "first"}
    assert calls == [order.id]
    assert charge.__name__ == "charge"
    with pytest.raises(Conflict):
        charge(Order(order.id, 43))


def test_a_value_the_codec_refuses_is_a_failure(client: Client, scope: str, key: str) -> None:
    with pytest.raises(TypeError):
        client.run_once(scope, key, lambda ctx: object())
    rec = client.get(scope, key)
    assert rec.status == pb.STATUS_FAILED and "TypeError" in rec.last_error


def test_async_work_is_refused_before_acquire(client: Client, scope: str, key: str) -> None:
    async def work(ctx: Any) -> None: ...

    with pytest.raises(TypeError):
        client.run_once(scope, key, work)
    with pytest.raises(CoordinatorError) as missing:
        client.get(scope, key)
    assert missing.value.code == grpc.StatusCode.NOT_FOUND
    assert missing.value.reason == "RECORD_NOT_FOUND"
