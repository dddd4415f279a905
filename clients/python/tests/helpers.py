"""Interceptors that lose a reply, and small waiting helpers."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Awaitable, Callable, List, Optional, TypeVar

import grpc
import grpc.aio

from idempotency_coordinator import pb

T = TypeVar("T")

ACQUIRE = "/idempotency.v1.Coordinator/Acquire"


def wait_until(pred: Callable[[], Optional[T]], timeout: float = 10.0, what: str = "condition") -> T:
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


async def async_wait_until(
    pred: Callable[[], Awaitable[Optional[T]]], timeout: float = 10.0, what: str = "condition"
) -> T:
    deadline = time.monotonic() + timeout
    while True:
        got = await pred()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


class _Unavailable(grpc.RpcError, grpc.Call):
    """What the caller sees instead of the first Acquire's response."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "reply lost (test interceptor)"

    def trailing_metadata(self) -> Any:
        return ()

    def initial_metadata(self) -> Any:
        return ()

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> float:
        return 0.0

    def cancel(self) -> bool:
        return False

    def add_callback(self, callback: Any) -> bool:
        return False


class DropFirstAcquireReply(grpc.UnaryUnaryClientInterceptor):  # type: ignore[type-arg]
    """Lets the first Acquire reach the server (which grants the lease), then
    throws its response away and raises UNAVAILABLE."""

    def __init__(self) -> None:
        self.dropped: List[pb.AcquireResponse] = []
        self.acquires = 0
        self._lock = threading.Lock()

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        if details.method != ACQUIRE:
            return continuation(details, request)
        with self._lock:
            self.acquires += 1
            first = not self.dropped
        outcome = continuation(details, request)
        if not first:
            return outcome
        self.dropped.append(outcome.result())  # it reached the server and was answered
        raise _Unavailable()


class AsyncDropFirstAcquireReply(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[type-arg]
    """The ``grpc.aio`` form of :class:`DropFirstAcquireReply`."""

    def __init__(self) -> None:
        self.dropped: List[pb.AcquireResponse] = []
        self.acquires = 0

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        method = details.method.decode() if isinstance(details.method, bytes) else details.method
        if method != ACQUIRE:
            return await continuation(details, request)
        self.acquires += 1
        first = not self.dropped
        call = await continuation(details, request)
        if not first:
            return call
        self.dropped.append(await call)
        raise grpc.aio.AioRpcError(
            code=grpc.StatusCode.UNAVAILABLE,
            initial_metadata=grpc.aio.Metadata(),
            trailing_metadata=grpc.aio.Metadata(),
            details="reply lost (test interceptor)",
            debug_error_string=None,
        )
