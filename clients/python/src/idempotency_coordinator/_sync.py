"""The blocking client, on a ``grpc.Channel``."""

from __future__ import annotations

import datetime
import heapq
import inspect
import itertools
import logging
import threading
import time
from typing import Any, Callable, List, Optional, Sequence, Tuple, TypeVar

import grpc

from . import _common as c
from . import _in_tx
from ._errors import CoordinatorError, LeaseLost
from ._proto.idempotency.v1 import coordinator_pb2 as pb
from ._proto.idempotency.v1 import coordinator_pb2_grpc as pb_grpc

__all__ = ["Client", "LeaseContext"]

log = logging.getLogger("idempotency_coordinator")

T = TypeVar("T")


class LeaseContext:
    """What the work gets while it holds the lease.

    ``token``, ``attempt`` and ``fencing_token`` (pass it to downstream
    writes) describe the lease; ``checkpoint`` is what an earlier holder (or
    this one) saved. ``lost`` is a :class:`threading.Event` set when the
    heartbeat learns the lease was taken over or ran out: poll it, wait on
    it, or call :meth:`raise_if_lost` between steps."""

    def __init__(
        self, client: "Client", scope: str, key: str, lease: pb.Lease, checkpoint: bytes, opts: c.Options
    ) -> None:
        self.scope = scope
        self.key = key
        self.token = lease.token
        self.attempt = lease.attempt
        self.fencing_token = lease.fencing_token
        self.expires_at = lease.expires_at.ToDatetime(tzinfo=datetime.timezone.utc)
        self.checkpoint = checkpoint
        self.lost = threading.Event()
        self.lost_reason: Optional[LeaseLost] = None
        self._client = client
        self._opts = opts
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._beat_failures = 0
        # When the expiry last granted was asked for (monotonic clock), and
        # when the heartbeat in flight was sent.
        self._granted_at = time.monotonic()
        self._beat_sent = self._granted_at

    @property
    def is_lost(self) -> bool:
        return self.lost.is_set()

    def raise_if_lost(self) -> None:
        """Raise :class:`LeaseLost` if the lease is gone."""
        if self.lost.is_set():
            raise self.lost_reason or LeaseLost(scope=self.scope, key=self.key)

    def save_checkpoint(self, checkpoint: bytes) -> None:
        """Save progress on the record (ExtendLease with ``checkpoint``, which
        also extends the lease), so that whoever takes over can resume.
        Returns once it is stored; raises :class:`LeaseLost` if the lease is
        gone."""
        self.raise_if_lost()
        self._extend(bytes(checkpoint))
        self.checkpoint = bytes(checkpoint)

    def _extend(self, checkpoint: Optional[bytes]) -> None:
        sent = time.monotonic()
        req = c.extend_request(self.scope, self.key, self.token, sent - self._granted_at)
        if checkpoint is not None:
            req.checkpoint = checkpoint
        try:
            resp = self._client._call(self._client.stub.ExtendLease, req, self._opts, self._opts.timeout)
        except CoordinatorError as err:
            if c.is_lease_error(err):
                self._mark_lost(c.lease_lost(self.scope, self.key, err))
                raise self.lost_reason or c.lease_lost(self.scope, self.key, err) from err
            raise
        with self._lock:
            self.expires_at = resp.lease.expires_at.ToDatetime(tzinfo=datetime.timezone.utc)
            self._granted_at = max(self._granted_at, sent)

    def _mark_lost(self, reason: LeaseLost) -> None:
        if self._stopped.is_set():
            return
        with self._lock:
            if self.lost_reason is None:
                self.lost_reason = reason
        self.lost.set()

    def _beat_request(self) -> pb.ExtendLeaseRequest:
        self._beat_sent = time.monotonic()
        return c.extend_request(self.scope, self.key, self.token, self._beat_sent - self._granted_at)

    def _beat_done(self, fut: Any) -> float:
        """Handle one heartbeat's answer; returns seconds until the next one,
        or a negative number when the heartbeat is over."""
        interval = self._opts.interval
        if self._stopped.is_set():
            return -1
        try:
            resp = fut.result()
        except grpc.RpcError as rpc_err:
            err = CoordinatorError.from_rpc_error(rpc_err)
            if c.is_lease_error(err):
                self._mark_lost(c.lease_lost(self.scope, self.key, err))
                return -1
            # UNAVAILABLE and the like: try again soon, within the interval.
            delay = min(self._opts.backoff(self._beat_failures, err.retry_after), interval)
            self._beat_failures += 1
            log.warning("heartbeat for %s/%s failed, trying again in %.2fs: %s", self.scope, self.key, delay, err)
            return delay
        except Exception as exc:  # noqa: BLE001 - a cancelled future, a bug: keep beating
            log.warning("heartbeat for %s/%s failed: %r", self.scope, self.key, exc)
            return min(self._opts.backoff(self._beat_failures, None), interval)
        self._beat_failures = 0
        with self._lock:
            self.expires_at = resp.lease.expires_at.ToDatetime(tzinfo=datetime.timezone.utc)
            self._granted_at = max(self._granted_at, self._beat_sent)
        return interval


class _Heartbeats:
    """One daemon thread per client that sends every lease's ExtendLease when
    it comes due, as a non-blocking call (its answer handled on gRPC's
    thread), so that a slow answer for one lease never delays another and a
    run_once does not start a thread of its own."""

    def __init__(self, client: "Client") -> None:
        self._client = client
        self._cond = threading.Condition()
        self._heap: List[Tuple[float, int, LeaseContext]] = []
        self._seq = itertools.count()
        self._thread: Optional[threading.Thread] = None

    def schedule(self, ctx: LeaseContext, delay: float) -> None:
        with self._cond:
            heapq.heappush(self._heap, (time.monotonic() + delay, next(self._seq), ctx))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="idempotency-heartbeat", daemon=True)
                self._thread.start()
            self._cond.notify()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while True:
                    # Leases already completed leave the heap at once.
                    while self._heap and self._heap[0][2]._stopped.is_set():
                        heapq.heappop(self._heap)
                    if not self._heap:
                        # Idle: end the thread after a while; schedule() starts another.
                        if not self._cond.wait(30) and not self._heap:
                            self._thread = None
                            return
                        continue
                    due = self._heap[0][0] - time.monotonic()
                    if due <= 0:
                        ctx = heapq.heappop(self._heap)[2]
                        break
                    self._cond.wait(due)
            self._send(ctx)

    def _send(self, ctx: LeaseContext) -> None:
        client = self._client
        try:
            fut = client.stub.ExtendLease.future(
                ctx._beat_request(), timeout=ctx._opts.timeout, metadata=client._metadata
            )
        except Exception as exc:  # noqa: BLE001 - keep the thread alive
            log.warning("heartbeat for %s/%s could not be sent: %r", ctx.scope, ctx.key, exc)
            self.schedule(ctx, min(ctx._opts.backoff(ctx._beat_failures, None), ctx._opts.interval))
            return

        def done(f: Any) -> None:
            delay = ctx._beat_done(f)
            if delay >= 0:
                self.schedule(ctx, delay)

        fut.add_done_callback(done)


class Client:
    """Runs operations exactly once through the coordinator.

    ``Client(channel)`` uses a caller's channel (the caller closes it);
    :meth:`connect` builds one (closed by :meth:`close` or ``with``).
    Keyword options (see :class:`Options`) are the defaults of every
    ``run_once``."""

    def __init__(
        self,
        channel: grpc.Channel,
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
        self._heartbeats = _Heartbeats(self)

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
        **options: Any,
    ) -> "Client":
        """Connect to ``target`` (``host:port``). TLS is used when any of
        ``root_certificates`` (the CA), ``private_key`` and
        ``certificate_chain`` (a client certificate, for mutual TLS) is given,
        or ``tls=True`` (the system's roots)."""
        use_tls = (
            tls if tls is not None else any(x is not None for x in (root_certificates, private_key, certificate_chain))
        )
        if use_tls:
            creds = grpc.ssl_channel_credentials(
                root_certificates=root_certificates,
                private_key=private_key,
                certificate_chain=certificate_chain,
            )
            channel = grpc.secure_channel(target, creds, options=list(channel_options))
        else:
            channel = grpc.insecure_channel(target, options=list(channel_options))
        client = cls(channel, bearer_token=bearer_token, **options)
        client._owns_channel = True
        return client

    def close(self) -> None:
        """Close the channel if this client built it."""
        if self._owns_channel:
            self.channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- calls -----------------------------------------------------------

    def _invoke(self, method: Callable[..., Any], req: Any, timeout: float) -> Any:
        try:
            return method(req, timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as err:
            raise CoordinatorError.from_rpc_error(err) from None

    def _call(self, method: Callable[..., Any], req: Any, opts: c.Options, timeout: float) -> Any:
        """One call, sent again as it was on a retryable failure."""
        retry = 0
        while True:
            try:
                return self._invoke(method, req, timeout)
            except CoordinatorError as err:
                if not c.is_retryable(err) or retry >= opts.max_retries:
                    raise
                delay = opts.backoff(retry, err.retry_after)
                retry += 1
                log.debug("retrying %s in %.2fs after %s", type(req).__name__, delay, err)
                time.sleep(delay)

    def get(self, scope: str, key: str, **options: Any) -> pb.Record:
        """The record of (scope, key); :class:`CoordinatorError` NOT_FOUND
        (reason RECORD_NOT_FOUND) when there is none."""
        opts = self.options.merged(**options)
        resp = self._call(self.stub.Get, pb.GetRequest(scope=scope, key=key), opts, opts.timeout)
        record: pb.Record = resp.record
        return record

    # -- the template ----------------------------------------------------

    def run_once(
        self,
        scope: str,
        key: str,
        work: Callable[[LeaseContext], T],
        *,
        fingerprint: Optional[str] = None,
        payload: Optional[bytes] = None,
        json_payload: Any = None,
        connection: Any = None,
        tenant: Optional[str] = None,
        schema: Optional[str] = None,
        **options: Any,
    ) -> "c.RunResult[T]":
        """Run ``work`` once for (scope, key) across every caller.

        Returns a :class:`RunResult` (fresh, or replayed from an earlier
        run); raises :class:`InProgress`, :class:`RetryLater`,
        :class:`Conflict`, :class:`Exhausted` or :class:`LeaseLost` for the
        other outcomes, :class:`CoordinatorError` for failed calls, and the
        work's own exception when it raised (after recording the failure).

        With ``connection`` (a psycopg 3 connection to the database that
        holds the coordinator's records), the work runs inside
        ``connection.transaction()`` and its result is stored there by
        ``idempotency_complete_in_tx``: the work's writes on ``connection``
        and the record's SUCCEEDED commit together. Inside the caller's own
        transaction that block is a savepoint and the caller commits;
        otherwise it is a transaction committed when the block ends. A
        holder whose lease was taken over gets :class:`LeaseLost` and its
        writes roll back. ``tenant`` is the tenant the coordinator files the
        caller's records under (``default`` when not given, as without
        authentication); ``schema`` the schema it was installed into, when
        the session's search_path does not list it (docs/in-transaction.md).
        Both apply only with ``connection``: given without it, they raise
        :class:`TypeError`."""
        if inspect.iscoroutinefunction(work):
            raise TypeError("run async work with AsyncClient")
        if connection is None and (tenant is not None or schema is not None):
            raise TypeError("tenant= and schema= apply only with connection=")
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
        resp: pb.AcquireResponse = self._call(self.stub.Acquire, req, opts, opts.acquire_timeout)
        if resp.decision == pb.DECISION_ALREADY_DONE:
            return c.replay(resp, opts)
        if resp.decision != pb.DECISION_PROCEED:
            c.raise_outcome(resp, scope, key)
        if connection is not None:
            return self._run_in_transaction(
                scope, key, work, resp, opts, connection, "default" if tenant is None else tenant, schema
            )
        return self._run(scope, key, work, resp, opts)

    def _lease(self, scope: str, key: str, resp: pb.AcquireResponse, opts: c.Options) -> LeaseContext:
        """The lease a PROCEED granted, its heartbeat started."""
        ctx = LeaseContext(self, scope, key, resp.lease, resp.record.checkpoint, opts)
        if opts.heartbeat:
            self._heartbeats.schedule(ctx, opts.interval)
        return ctx

    @staticmethod
    def _work(work: Callable[[LeaseContext], T], ctx: LeaseContext) -> T:
        """Run the work; an async one is refused."""
        value = work(ctx)
        if inspect.isawaitable(value):
            if inspect.iscoroutine(value):
                value.close()
            raise TypeError("the work returned an awaitable: run async work with AsyncClient")
        return value

    def _run(
        self, scope: str, key: str, work: Callable[[LeaseContext], T], resp: pb.AcquireResponse, opts: c.Options
    ) -> "c.RunResult[T]":
        ctx = self._lease(scope, key, resp, opts)
        token = c.set_current(ctx)
        try:
            value = self._work(work, ctx)
            # Encoding belongs to the work: a value the codec refuses is a failure.
            complete = c.success_request(scope, key, ctx.token, value, opts)
        except Exception as exc:
            ctx._stopped.set()
            if ctx.lost.is_set():
                raise (ctx.lost_reason or c.lease_lost(scope, key)) from exc
            self._fail(scope, key, ctx.token, exc, opts)
            raise
        finally:
            ctx._stopped.set()
            c.reset_current(token)
        # From here on the work has run: its value goes back with any error.
        if ctx.lost.is_set():
            raise c.unrecorded(ctx.lost_reason or c.lease_lost(scope, key), value)
        try:
            done = self._call(self.stub.Complete, complete, opts, opts.timeout)
        except CoordinatorError as err:
            if c.is_lease_error(err):
                raise c.unrecorded(c.lease_lost(scope, key, err), value) from None
            c.unrecorded(err, value)
            raise
        return c.RunResult(value=value, replayed=False, record=done.record, lease=c.lease_info(resp.lease))

    def _run_in_transaction(
        self,
        scope: str,
        key: str,
        work: Callable[[LeaseContext], T],
        resp: pb.AcquireResponse,
        opts: c.Options,
        connection: Any,
        tenant: str,
        schema: Optional[str],
    ) -> "c.RunResult[T]":
        ctx = self._lease(scope, key, resp, opts)
        token = c.set_current(ctx)
        begun = completing = False
        try:
            with connection.transaction():
                begun = True
                value = self._work(work, ctx)
                complete = c.success_request(scope, key, ctx.token, value, opts)
                # The heartbeat ends before the completion takes the row lock.
                ctx._stopped.set()
                completing = True
                _in_tx.complete(connection, tenant, schema, complete)
        except Exception as exc:
            ctx._stopped.set()
            if not begun:
                # The caller's transaction refused the block (an aborted
                # transaction, say): the work never started, give the key back.
                self._release(scope, key, ctx.token, opts)
                raise
            if not completing:
                if ctx.lost.is_set():
                    raise (ctx.lost_reason or c.lease_lost(scope, key)) from exc
                self._fail(scope, key, ctx.token, exc, opts)
                raise
            refused = _in_tx.refusal(exc, scope, key)
            if isinstance(refused, CoordinatorError) and refused.reason == "RESULT_REFUSED":
                # The same value is refused every time: the key fails for good.
                failure = pb.Failure(error=f"the result was refused: {refused.message}", permanent=True)
                self._report(pb.CompleteRequest(scope=scope, key=key, lease_token=ctx.token, failure=failure), opts)
            elif isinstance(refused, CoordinatorError) and refused.reason == "RECORD_NOT_FOUND":
                # A wrong tenant, say: the lease is still held, give it back.
                self._release(scope, key, ctx.token, opts)
            if refused is not None:
                raise refused from exc
            # The work's writes rolled back: nothing happened, give the key back.
            self._release(scope, key, ctx.token, opts)
            raise
        finally:
            ctx._stopped.set()
            c.reset_current(token)
        record = _in_tx.succeeded(resp.record, complete)
        return c.RunResult(value=value, replayed=False, record=record, lease=c.lease_info(resp.lease))

    def _report(self, req: pb.CompleteRequest, opts: c.Options, cause: Optional[Exception] = None) -> None:
        """Send a Complete that records a failure or gives the lease back,
        best effort: if it fails too, the lease runs out. With ``cause`` (the
        work's exception), a refused lease is raised as LeaseLost from it.
        Every Complete of a run but the success's goes through here, with or
        without ``connection``."""
        try:
            self._call(self.stub.Complete, req, opts, opts.timeout)
        except CoordinatorError as err:
            if cause is not None and c.is_lease_error(err):
                raise c.lease_lost(req.scope, req.key, err) from cause
            what = "release" if req.HasField("release") else "record the failure of"
            log.warning("could not %s %s/%s: %s", what, req.scope, req.key, err)

    def _release(self, scope: str, key: str, token: str, opts: c.Options) -> None:
        """Give the lease back at once."""
        self._report(pb.CompleteRequest(scope=scope, key=key, lease_token=token, release=pb.Release()), opts)

    def _fail(self, scope: str, key: str, token: str, exc: Exception, opts: c.Options) -> None:
        """Record the work's failure (its exception is raised again by the
        caller); a refused Complete means the lease was lost."""
        self._report(c.failure_request(scope, key, token, exc, opts), opts, cause=exc)
