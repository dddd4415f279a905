"""The acceptance list of clients/README.md, with the asyncio AsyncClient."""

from __future__ import annotations

import asyncio
import datetime
import uuid
from typing import Any, AsyncIterator, List

import grpc
import grpc.aio
import pytest

from harness import Server
from helpers import AsyncDropFirstAcquireReply, async_wait_until
from idempotency_coordinator import (
    AsyncClient,
    AsyncLeaseContext,
    Conflict,
    CoordinatorError,
    Exhausted,
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
async def client(server: Server) -> AsyncIterator[AsyncClient]:
    assert server.addr
    async with AsyncClient.connect(server.addr) as c:
        yield c


@pytest.fixture
async def stub(server: Server) -> AsyncIterator[Any]:
    assert server.addr
    async with grpc.aio.insecure_channel(server.addr) as ch:
        yield pb_grpc.CoordinatorStub(ch)


async def acquire_until_proceed(stub: Any, scope: str, key: str, timeout: float = 15.0) -> pb.AcquireResponse:
    async def attempt() -> Any:
        resp = await stub.Acquire(pb.AcquireRequest(scope=scope, key=key, request_id=uuid.uuid4().hex), timeout=5)
        return resp if resp.decision == pb.DECISION_PROCEED else None

    resp: pb.AcquireResponse = await async_wait_until(attempt, timeout, "the other caller to take over")
    return resp


async def test_first_call_runs_and_second_replays(client: AsyncClient, scope: str, key: str) -> None:
    runs: List[int] = []

    async def work(ctx: AsyncLeaseContext) -> dict[str, Any]:
        runs.append(ctx.attempt)
        assert current_lease() is ctx
        return {"charged": 1250}

    first = await client.run_once(scope, key, work)
    assert not first.replayed and first.value == {"charged": 1250}
    assert first.lease is not None and first.lease.attempt == 1
    second = await client.run_once(scope, key, work)
    assert second.replayed and second.value == {"charged": 1250}
    assert runs == [1]


async def test_twenty_concurrent_calls_run_once(client: AsyncClient, scope: str, key: str) -> None:
    runs: List[int] = []

    async def work(ctx: AsyncLeaseContext) -> str:
        runs.append(ctx.attempt)
        await asyncio.sleep(0.3)
        return f"receipt-{ctx.fencing_token}"

    results = await asyncio.gather(*(client.run_once(scope, key, work) for _ in range(20)))
    assert runs == [1]
    assert len({r.value for r in results}) == 1
    assert sum(1 for r in results if not r.replayed) == 1
    assert (await client.get(scope, key)).attempt_count == 1


async def test_heartbeat_keeps_the_lease_past_its_ttl(client: AsyncClient, stub: Any, scope: str, key: str) -> None:
    seen: List[datetime.datetime] = []

    async def work(ctx: AsyncLeaseContext) -> str:
        loop = asyncio.get_running_loop()
        end = loop.time() + 5  # two and a half times the lease's TTL
        while loop.time() < end:
            if not seen or seen[-1] != ctx.expires_at:
                seen.append(ctx.expires_at)
            await asyncio.sleep(0.05)
        other = await stub.Acquire(pb.AcquireRequest(scope=scope, key=key, request_id="other"), timeout=5)
        assert other.decision == pb.DECISION_IN_PROGRESS
        return "done"

    res = await client.run_once(scope, key, work, lease_ttl=2)
    assert res.value == "done" and res.record.attempt_count == 1
    assert len(seen) >= 4, seen


async def test_failure_leaves_the_key_retryable(client: AsyncClient, scope: str, key: str) -> None:
    attempts: List[int] = []

    async def failing(ctx: AsyncLeaseContext) -> str:
        attempts.append(ctx.attempt)
        raise TransientError("card network down", retry_after=datetime.timedelta(seconds=1))

    with pytest.raises(TransientError):
        await client.run_once(scope, key, failing)
    with pytest.raises(RetryLater) as later:
        await client.run_once(scope, key, failing)
    assert later.value.retry_after > datetime.timedelta(0)

    async def succeeding(ctx: AsyncLeaseContext) -> int:
        attempts.append(ctx.attempt)
        return ctx.attempt

    async def again() -> Any:
        try:
            return await client.run_once(scope, key, succeeding)
        except RetryLater:
            return None

    res = await async_wait_until(again, 10, "the retry to come due")
    assert res.value == 2 and not res.replayed
    assert attempts == [1, 2]


async def test_permanent_failure_exhausts_the_key(client: AsyncClient, scope: str, key: str) -> None:
    async def declined(ctx: AsyncLeaseContext) -> str:
        raise PermanentError("card declined")

    with pytest.raises(PermanentError):
        await client.run_once(scope, key, declined)
    with pytest.raises(Exhausted) as ex:
        await client.run_once(scope, key, declined)
    assert "card declined" in ex.value.last_error


async def test_taken_over_holder_is_cancelled_and_its_late_complete_refused(
    client: AsyncClient, stub: Any, scope: str, key: str
) -> None:
    started = asyncio.Event()
    holder: dict[str, Any] = {}

    async def work(ctx: AsyncLeaseContext) -> str:
        holder["token"] = ctx.token
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            holder["cancelled"] = True
            raise
        return "A"

    a = asyncio.ensure_future(client.run_once(scope, key, work, lease_ttl=1, heartbeat_interval=1.5))
    await asyncio.wait_for(started.wait(), 10)
    b = await acquire_until_proceed(stub, scope, key)
    with pytest.raises(LeaseLost) as lost:
        await asyncio.wait_for(a, 30)
    assert lost.value.reason in ("LEASE_LOST", "LEASE_EXPIRED")
    assert holder.get("cancelled") is True
    assert not lost.value.has_unrecorded_value, "the work was cancelled: it returned nothing"

    with pytest.raises(grpc.aio.AioRpcError) as late:
        await stub.Complete(
            pb.CompleteRequest(scope=scope, key=key, lease_token=holder["token"], success=pb.Success(result=b'"A"')),
            timeout=5,
        )
    err = CoordinatorError.from_rpc_error(late.value)
    assert err.code == grpc.StatusCode.ABORTED and err.reason == "LEASE_LOST"
    rec = await client.get(scope, key)
    assert rec.status == pb.STATUS_PROCESSING and rec.fencing_token == b.lease.fencing_token


async def test_taken_over_without_heartbeat_complete_is_refused(
    client: AsyncClient, stub: Any, scope: str, key: str
) -> None:
    started = asyncio.Event()
    taken_over = asyncio.Event()

    async def work(ctx: AsyncLeaseContext) -> str:
        started.set()
        await asyncio.wait_for(taken_over.wait(), 20)
        return "A"

    a = asyncio.ensure_future(client.run_once(scope, key, work, lease_ttl=1, heartbeat=False))
    await asyncio.wait_for(started.wait(), 10)
    b = await acquire_until_proceed(stub, scope, key)
    taken_over.set()
    with pytest.raises(LeaseLost) as lost:
        await asyncio.wait_for(a, 30)
    assert lost.value.reason == "LEASE_LOST"
    # The work ran: what it returned comes back, not stored.
    assert lost.value.has_unrecorded_value and lost.value.unrecorded_value == "A"
    rec = await client.get(scope, key)
    assert rec.status == pb.STATUS_PROCESSING and rec.fencing_token == b.lease.fencing_token


async def test_lost_reply_is_recovered_by_the_same_request_id(server: Server, scope: str, key: str) -> None:
    assert server.addr
    drop = AsyncDropFirstAcquireReply()
    runs: List[int] = []

    async def work(ctx: AsyncLeaseContext) -> str:
        runs.append(ctx.attempt)
        return "charged"

    async with AsyncClient.connect(server.addr, interceptors=[drop]) as client:
        res = await client.run_once(scope, key, work)
    assert drop.acquires == 2 and len(drop.dropped) == 1
    lost = drop.dropped[0]
    assert lost.decision == pb.DECISION_PROCEED
    assert res.lease is not None
    assert (res.lease.token, res.lease.attempt, res.lease.fencing_token) == (
        lost.lease.token,
        1,
        lost.lease.fencing_token,
    )
    assert runs == [1]
    async with AsyncClient.connect(server.addr) as other:
        assert (await other.get(scope, key)).attempt_count == 1


async def test_invalid_argument_is_typed(client: AsyncClient, key: str) -> None:
    async def work(ctx: AsyncLeaseContext) -> None:
        raise AssertionError("must not run")

    with pytest.raises(CoordinatorError) as bad:
        await client.run_once("bad scope", key, work)
    assert bad.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert bad.value.reason == "INVALID_ARGUMENT"
    assert "scope" in [v.field for v in bad.value.field_violations]


async def test_async_checkpoint(client: AsyncClient, scope: str, key: str) -> None:
    async def first(ctx: AsyncLeaseContext) -> str:
        await ctx.save_checkpoint(b"page=3")
        raise TransientError("interrupted", retry_after=datetime.timedelta(0))

    with pytest.raises(TransientError):
        await client.run_once(scope, key, first)

    async def second(ctx: AsyncLeaseContext) -> str:
        return ctx.checkpoint.decode()

    assert (await client.run_once(scope, key, second)).value == "page=3"


async def test_decorator_runs_once_and_replays(client: AsyncClient, scope: str) -> None:
    calls: List[str] = []

    @idempotent(client, scope=scope, key=lambda order_id, **_: order_id)
    async def send_email(order_id: str, *, to: str) -> str:
        calls.append(order_id)
        return f"sent to {to}"

    order_id = uuid.uuid4().hex
    assert await send_email(order_id, to="a@example.com") == "sent to a@example.com"
    assert await send_email(order_id, to="b@example.com") == "sent to a@example.com"
    assert calls == [order_id]


async def test_decorator_checks_the_client_kind(client: AsyncClient) -> None:
    with pytest.raises(TypeError):

        @idempotent(client, scope="x", key=lambda: "k")
        def plain() -> None: ...


async def test_conflict(client: AsyncClient, scope: str, key: str) -> None:
    async def work(ctx: AsyncLeaseContext) -> int:
        return 1

    await client.run_once(scope, key, work, fingerprint="v1")
    with pytest.raises(Conflict):
        await client.run_once(scope, key, work, fingerprint="v2")


async def test_cancelling_run_once_cancels_the_work(client: AsyncClient, scope: str, key: str) -> None:
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def work(ctx: AsyncLeaseContext) -> str:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    task = asyncio.ensure_future(client.run_once(scope, key, work))
    await asyncio.wait_for(started.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(cancelled.wait(), 5)
    # Nothing was Completed: the lease is still held until it runs out.
    assert (await client.get(scope, key)).status == pb.STATUS_PROCESSING
