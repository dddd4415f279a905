#!/usr/bin/env python3
"""What the template costs over the bare generated stub.

Starts the coordinator (IDEMPOTENCY_COORDINATOR_BIN) on a database of its own
(DATABASE_URL), then times, alternating in rounds, (a) ``run_once`` on a
fresh key (Acquire PROCEED + Complete, heartbeat on) and (b) the generated
stub's Acquire + Complete with the same fields, and prints the medians and
the per-cycle overhead, for the blocking Client and for the AsyncClient.

    .venv/bin/python bench.py [--cycles 1000] [--rounds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable, List

import grpc
import grpc.aio

sys.path.insert(0, str(Path(__file__).resolve().parent / "tests"))

from harness import Database, Server  # noqa: E402
from idempotency_coordinator import AsyncClient, Client, JsonCodec, pb, pb_grpc  # noqa: E402
from idempotency_coordinator._common import to_duration  # noqa: E402

SCOPE = "bench.python"
VALUE = {"receipt": "r-1", "amount": 1250}
TTL = to_duration(datetime.timedelta(seconds=60))
WAIT = to_duration(datetime.timedelta(seconds=10))
RESULT = JsonCodec().encode(VALUE)


def bare_requests(key: str) -> tuple[pb.AcquireRequest, Callable[[str], pb.CompleteRequest]]:
    acq = pb.AcquireRequest(scope=SCOPE, key=key, lease_ttl=TTL, wait=WAIT, request_id=uuid.uuid4().hex)

    def complete(token: str) -> pb.CompleteRequest:
        return pb.CompleteRequest(
            scope=SCOPE,
            key=key,
            lease_token=token,
            success=pb.Success(result=RESULT, content_type="application/json"),
        )

    return acq, complete


def med_ms(xs: List[float]) -> float:
    return statistics.median(xs) * 1000


def report(kind: str, a: List[float], b: List[float], cpu_a: float, cpu_b: float) -> None:
    ma, mb = med_ms(a), med_ms(b)
    print(f"{kind}: run_once median {ma:.3f} ms, bare stub median {mb:.3f} ms, overhead {ma - mb:+.3f} ms per cycle")
    # The client process's own CPU time, which the server's and the machine's noise does not reach.
    print(
        f"{kind}: client CPU per cycle: run_once {cpu_a / len(a) * 1000:.3f} ms, "
        f"bare stub {cpu_b / len(b) * 1000:.3f} ms, overhead {(cpu_a / len(a) - cpu_b / len(b)) * 1000:+.3f} ms"
    )


def bench_sync(addr: str, cycles: int, rounds: int) -> None:
    channel = grpc.insecure_channel(addr)
    client = Client(channel)
    stub = pb_grpc.CoordinatorStub(channel)
    a: List[float] = []
    b: List[float] = []
    cpu_a = cpu_b = 0.0

    def work(ctx: Any) -> Any:
        return VALUE

    for _ in range(20):  # warm up the connection and the server
        client.run_once(SCOPE, uuid.uuid4().hex, work)
    per = cycles // rounds
    for _ in range(rounds):
        for _ in range(per):
            key = uuid.uuid4().hex
            t, cpu = time.perf_counter(), time.process_time()
            res = client.run_once(SCOPE, key, work)
            a.append(time.perf_counter() - t)
            cpu_a += time.process_time() - cpu
            assert not res.replayed
        for _ in range(per):
            acq, complete = bare_requests(uuid.uuid4().hex)
            t, cpu = time.perf_counter(), time.process_time()
            resp = stub.Acquire(acq, timeout=20)
            assert resp.decision == pb.DECISION_PROCEED
            stub.Complete(complete(resp.lease.token), timeout=10)
            b.append(time.perf_counter() - t)
            cpu_b += time.process_time() - cpu
    channel.close()
    report(f"sync  ({len(a)}+{len(b)} cycles)", a, b, cpu_a, cpu_b)


async def bench_async(addr: str, cycles: int, rounds: int) -> None:
    channel = grpc.aio.insecure_channel(addr)
    client = AsyncClient(channel)
    stub: Any = pb_grpc.CoordinatorStub(channel)
    a: List[float] = []
    b: List[float] = []
    cpu_a = cpu_b = 0.0

    async def work(ctx: Any) -> Any:
        return VALUE

    for _ in range(20):
        await client.run_once(SCOPE, uuid.uuid4().hex, work)
    per = cycles // rounds
    for _ in range(rounds):
        for _ in range(per):
            key = uuid.uuid4().hex
            t, cpu = time.perf_counter(), time.process_time()
            res = await client.run_once(SCOPE, key, work)
            a.append(time.perf_counter() - t)
            cpu_a += time.process_time() - cpu
            assert not res.replayed
        for _ in range(per):
            acq, complete = bare_requests(uuid.uuid4().hex)
            t, cpu = time.perf_counter(), time.process_time()
            resp = await stub.Acquire(acq, timeout=20)
            assert resp.decision == pb.DECISION_PROCEED
            await stub.Complete(complete(resp.lease.token), timeout=10)
            b.append(time.perf_counter() - t)
            cpu_b += time.process_time() - cpu
    await channel.close(None)
    report(f"async ({len(a)}+{len(b)} cycles)", a, b, cpu_a, cpu_b)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cycles", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args()
    db = Database("idem_py_bench")
    try:
        server = Server(db.url)
        try:
            assert server.addr
            bench_sync(server.addr, args.cycles, args.rounds)
            asyncio.run(bench_async(server.addr, args.cycles, args.rounds))
        finally:
            server.stop()
    finally:
        db.drop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
