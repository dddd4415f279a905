"""The asyncio client, on a ``grpc.aio.Channel``."""

from __future__ import annotations

import asyncio
import datetime
import inspect
import logging
import time
from typing import Any, Awaitable, Callable, Optional, Sequence, Tuple, TypeVar, cast

import grpc
import grpc.aio

from . import _common as c
from ._errors import CoordinatorError, LeaseLost
from ._proto.idempotency.v1 import coordinator_pb2 as pb
from ._proto.idempotency.v1 import coordinator_pb2_grpc as pb_grpc

__all__ = ["AsyncClient", "AsyncLeaseContext"]

log = logging.getLogger("idempotency_coordinator")

T = TypeVar("T")


class AsyncLeaseContext:
    """What the asyncio work gets while it holds the lease: as
    :class:`LeaseContext`, with ``lost`` an :class:`asyncio.Event`. When the
    lease is lost the work's task is cancelled and ``run_once`` raises
    :class:`LeaseLost`."""

    def __init__(
        self, client: "AsyncClient", scope: str, key: str, lease: pb.Lease, checkpoint: bytes, opts: c.Options
    ) -> None:
        self.scope = scope
        self.key = key
        self.token = lease.token
        self.attempt = lease.attempt
        self.fencing_token = lease.fencing_token
        self.expires_at = lease.expires_at.ToDatetime(tzinfo=datetime.timezone.utc)
        self.checkpoint = checkpoint
        self.lost = asyncio.Event()
        self.lost_reason: Optional[LeaseLost] = None
        self._client = client
        self._opts = opts
        self._stopped = False
        # When the expiry last granted was asked for (monotonic clock).
        self._granted_at = time.monotonic()

    @property
    def is_lost(self) -> bool:
        return self.lost.is_set()

    def raise_if_lost(self) -> None:
        """Raise :class:`LeaseLost` if the lease is gone."""
        if self.lost.is_set():
            raise self.lost_reason or LeaseLost(scope=self.scope, key=self.key)

    async def save_checkpoint(self, checkpoint: bytes) -> None:
        """Save progress on the record (and extend the lease); raises
        :class:`LeaseLost` if the lease is gone."""
        self.raise_if_lost()
        sent = time.monotonic()
        req = self._extend_request(sent)
        req.checkpoint = bytes(checkpoint)
        try:
            resp = await self._client._call(self._client.stub.ExtendLease, req, self._opts, self._opts.timeout)
        except CoordinatorError as err:
            if c.is_lease_error(err):
                self._mark_lost(c.lease_lost(self.scope, self.key, err))
                raise self.lost_reason or c.lease_lost(self.scope, self.key, err) from err
            raise
        self.expires_at = resp.lease.expires_at.ToDatetime(tzinfo=datetime.timezone.utc)
        self._granted_at = max(self._granted_at, sent)
        self.checkpoint = bytes(checkpoint)

    def _extend_request(self, sent: float) -> pb.ExtendLeaseRequest:
        return c.extend_request(self.scope, self.key, self.token, sent - self._granted_at)

    def _mark_lost(self, reason: LeaseLost) -> None:
        if self._stopped:
            return
        if self.lost_reason is None:
            self.lost_reason = reason
        self.lost.set()

    async def _heartbeat(self) -> None:
        interval = self._opts.interval
        delay = interval
        failures = 0
        while True:
            await asyncio.sleep(delay)
            sent = time.monotonic()
            try:
                resp = await self._client._invoke(
                    self._client.stub.ExtendLease, self._extend_request(sent), self._opts.timeout
                )
            except CoordinatorError as err:
                if c.is_lease_error(err):
                    self._mark_lost(c.lease_lost(self.scope, self.key, err))
                    return
                delay = min(self._opts.backoff(failures, err.retry_after), interval)
                failures += 1
                log.warning("heartbeat for %s/%s failed, trying again in %.2fs: %s", self.scope, self.key, delay, err)
                continue
            failures = 0
            delay = interval
            self.expires_at = resp.lease.expires_at.ToDatetime(tzinfo=datetime.timezone.utc)
            self._granted_at = max(self._granted_at, sent)


class AsyncClient:
    """The asyncio form of :class:`Client`: the same options and outcomes,
    ``await client.run_once(scope, key, work)`` with ``async def work(ctx)``."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        *,
        bearer_token: Optional[str] = None,
        metadata: Sequence[Tuple[str, str]] = (),
        **options: Any,
    ) -> None:
        self.channel = channel
        self.stub = pb_grpc.CoordinatorStub(channel)
        self.options = c.build_options(**options)
        self._metadata: c.Metadata = c.auth_metadata(bearer_token) + tuple(metadata)
        self._owns_channel = False

    @classmethod
    def connect(
        cls,
        target: str,
        *,
        bearer_token: Optional[str] = None,
        root_certificates: Optional[bytes] = None,
        private_key: Optional[bytes] = None,
        certificate_chain: Optional[bytes] = None,
        tls: Optional[bool] = None,
        channel_options: Sequence[Tuple[str, Any]] = (),
        interceptors: Optional[Sequence[Any]] = None,
        **options: Any,
    ) -> "AsyncClient":
        """As :meth:`Client.connect`, building a ``grpc.aio`` channel."""
        use_tls = (
            tls if tls is not None else any(x is not None for x in (root_certificates, private_key, certificate_chain))
        )
        if use_tls:
            creds = grpc.ssl_channel_credentials(
                root_certificates=root_certificates,
                private_key=private_key,
                certificate_chain=certificate_chain,
            )
            channel = grpc.aio.secure_channel(target, creds, options=list(channel_options), interceptors=interceptors)
        else:
            channel = grpc.aio.insecure_channel(target, options=list(channel_options), interceptors=interceptors)
        client = cls(channel, bearer_token=bearer_token, **options)
        client._owns_channel = True
        return client

    async def close(self) -> None:
        """Close the channel if this client built it."""
        if self._owns_channel:
            await self.channel.close(None)

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- calls -----------------------------------------------------------

    async def _invoke(self, method: Callable[..., Any], req: Any, timeout: float) -> Any:
        try:
            return await method(req, timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as err:
            raise CoordinatorError.from_rpc_error(err) from None

    async def _call(self, method: Callable[..., Any], req: Any, opts: c.Options, timeout: float) -> Any:
        retry = 0
        while True:
            try:
                return await self._invoke(method, req, timeout)
            except CoordinatorError as err:
                if not c.is_retryable(err) or retry >= opts.max_retries:
                    raise
                delay = opts.backoff(retry, err.retry_after)
                retry += 1
                log.debug("retrying %s in %.2fs after %s", type(req).__name__, delay, err)
                await asyncio.sleep(delay)

    async def get(self, scope: str, key: str, **options: Any) -> pb.Record:
        """The record of (scope, key); :class:`CoordinatorError` NOT_FOUND
        when there is none."""
        opts = self.options.merged(**options)
        resp = await self._call(self.stub.Get, pb.GetRequest(scope=scope, key=key), opts, opts.timeout)
        record: pb.Record = resp.record
        return record

    # -- the template ----------------------------------------------------

    async def run_once(
        self,
        scope: str,
        key: str,
        work: Callable[[AsyncLeaseContext], Awaitable[T]],
        *,
        fingerprint: Optional[str] = None,
        payload: Optional[bytes] = None,
        json_payload: Any = None,
        **options: Any,
    ) -> "c.RunResult[T]":
        """As :meth:`Client.run_once`, with an ``async`` work. When the lease
        is lost the work's task is cancelled and :class:`LeaseLost` raised."""
        opts = self.options.merged(**options)
        req = c.acquire_request(
            scope,
            key,
            opts,
            c.new_request_id(),
            fingerprint=fingerprint,
            payload=payload,
            json_payload=json_payload,
        )
        resp: pb.AcquireResponse = await self._call(self.stub.Acquire, req, opts, opts.acquire_timeout)
        if resp.decision == pb.DECISION_ALREADY_DONE:
            return c.replay(resp, opts)
        if resp.decision != pb.DECISION_PROCEED:
            c.raise_outcome(resp, scope, key)
        return await self._run(scope, key, work, resp, opts)

    async def _run(
        self,
        scope: str,
        key: str,
        work: Callable[[AsyncLeaseContext], Awaitable[T]],
        resp: pb.AcquireResponse,
        opts: c.Options,
    ) -> "c.RunResult[T]":
        ctx = AsyncLeaseContext(self, scope, key, resp.lease, resp.record.checkpoint, opts)

        async def body() -> T:
            c.set_current(ctx)  # in the task's own copy of the context
            result: Any = work(ctx)
            if inspect.isawaitable(result):
                result = await result
            return cast(T, result)

        work_task = asyncio.ensure_future(body())
        beat = asyncio.ensure_future(ctx._heartbeat()) if opts.heartbeat else None
        lost_wait = asyncio.ensure_future(ctx.lost.wait())
        try:
            await asyncio.wait({work_task, lost_wait}, return_when=asyncio.FIRST_COMPLETED)
            if not work_task.done():
                # The lease was lost first: tell the work by cancelling its
                # task, and let it end (whatever it raises then).
                work_task.cancel()
                await asyncio.wait({work_task})
        except asyncio.CancelledError:
            # The caller gave up: stop the work and the heartbeat; nothing is
            # Completed, the lease runs out on its own.
            work_task.cancel()
            raise
        finally:
            ctx._stopped = True
            lost_wait.cancel()
            if beat is not None:
                beat.cancel()
        if ctx.lost.is_set():
            cause = None if work_task.cancelled() else work_task.exception()
            lost = ctx.lost_reason or c.lease_lost(scope, key)
            if not work_task.cancelled() and cause is None:
                # The work returned before it heard: it ran.
                lost = c.unrecorded(lost, work_task.result())
            raise lost from cause
        if work_task.cancelled():
            # The work cancelled itself.
            raise asyncio.CancelledError()
        exc = work_task.exception()
        if exc is not None and not isinstance(exc, Exception):
            raise exc
        if exc is None:
            value = work_task.result()
            try:
                complete = c.success_request(scope, key, ctx.token, value, opts)
            except Exception as enc_err:  # a value the codec refuses is a failure
                exc = enc_err
        if exc is not None:
            await self._fail(scope, key, ctx.token, exc, opts)
            raise exc
        try:
            done = await self._call(self.stub.Complete, complete, opts, opts.timeout)
        except CoordinatorError as err:
            # The work ran: its value goes back with the error.
            if c.is_lease_error(err):
                raise c.unrecorded(c.lease_lost(scope, key, err), value) from None
            c.unrecorded(err, value)
            raise
        return c.RunResult(value=value, replayed=False, record=done.record, lease=c.lease_info(resp.lease))

    async def _fail(self, scope: str, key: str, token: str, exc: Exception, opts: c.Options) -> None:
        try:
            await self._call(self.stub.Complete, c.failure_request(scope, key, token, exc, opts), opts, opts.timeout)
        except CoordinatorError as err:
            if c.is_lease_error(err):
                raise c.lease_lost(scope, key, err) from exc
            log.warning("could not record the failure of %s/%s: %s", scope, key, err)
