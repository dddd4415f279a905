"""The blocking client, on a ``grpc.Channel``."""

from __future__ import annotations

import datetime
import logging
import threading
import time
from typing import Any, Callable, Optional, Sequence, Tuple, TypeVar

import grpc

from . import _common as c
from ._errors import CoordinatorError, LeaseLost
from ._proto.idempotency.v1 import coordinator_pb2 as pb
from ._proto.idempotency.v1 import coordinator_pb2_grpc as pb_grpc

__all__ = ["Client", "LeaseContext"]

log = logging.getLogger("idempotency_coordinator")

T = TypeVar("T")
Req = TypeVar("Req")
Resp = TypeVar("Resp")


class LeaseContext:
    """What the work gets while it holds the lease.

    ``token``, ``attempt`` and ``fencing_token`` (pass it to downstream
    writes) describe the lease; ``checkpoint`` is what an earlier holder (or
    this one) saved. ``lost`` is a :class:`threading.Event` set when the
    heartbeat learns the lease was taken over or ran out: poll it, wait on
    it, or call :meth:`raise_if_lost` between steps."""

    def __init__(self, client: "Client", scope: str, key: str, lease: pb.Lease, checkpoint: bytes, opts: c.Options) -> None:
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
        req = pb.ExtendLeaseRequest(
            scope=self.scope,
            key=self.key,
            lease_token=self.token,
            extend_by=c.to_duration(self._opts.lease_ttl),
        )
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

    def _mark_lost(self, reason: LeaseLost) -> None:
        if self._stopped.is_set():
            return
        with self._lock:
            if self.lost_reason is None:
                self.lost_reason = reason
        self.lost.set()

    def _heartbeat(self) -> None:
        interval = self._opts.interval
        delay = interval
        failures = 0
        while not self._stopped.wait(delay):
            req = pb.ExtendLeaseRequest(
                scope=self.scope,
                key=self.key,
                lease_token=self.token,
                extend_by=c.to_duration(self._opts.lease_ttl),
            )
            try:
                resp = self._client._invoke(self._client.stub.ExtendLease, req, self._opts.timeout)
            except CoordinatorError as err:
                if self._stopped.is_set():
                    return
                if c.is_lease_error(err):
                    self._mark_lost(c.lease_lost(self.scope, self.key, err))
                    return
                # UNAVAILABLE and the like: try again soon, within the interval.
                delay = min(self._opts.backoff(failures, err.retry_after), interval)
                failures += 1
                log.warning("heartbeat for %s/%s failed, trying again in %.2fs: %s", self.scope, self.key, delay, err)
                continue
            failures = 0
            delay = interval
            with self._lock:
                self.expires_at = resp.lease.expires_at.ToDatetime(tzinfo=datetime.timezone.utc)


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
        use_tls = tls if tls is not None else any(x is not None for x in (root_certificates, private_key, certificate_chain))
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
        **options: Any,
    ) -> "c.RunResult[T]":
        """Run ``work`` once for (scope, key) across every caller.

        Returns a :class:`RunResult` (fresh, or replayed from an earlier
        run); raises :class:`InProgress`, :class:`RetryLater`,
        :class:`Conflict`, :class:`Exhausted` or :class:`LeaseLost` for the
        other outcomes, :class:`CoordinatorError` for failed calls, and the
        work's own exception when it raised (after recording the failure)."""
        opts = self.options.merged(**options)
        req = c.acquire_request(
            scope, key, opts, c.new_request_id(),
            fingerprint=fingerprint, payload=payload, json_payload=json_payload,
        )
        resp: pb.AcquireResponse = self._call(self.stub.Acquire, req, opts, opts.acquire_timeout)
        if resp.decision == pb.DECISION_ALREADY_DONE:
            return c.replay(resp, opts)
        if resp.decision != pb.DECISION_PROCEED:
            c.raise_outcome(resp, scope, key)
        return self._run(scope, key, work, resp, opts)

    def _run(self, scope: str, key: str, work: Callable[[LeaseContext], T], resp: pb.AcquireResponse, opts: c.Options) -> "c.RunResult[T]":
        ctx = LeaseContext(self, scope, key, resp.lease, resp.record.checkpoint, opts)
        beat: Optional[threading.Thread] = None
        if opts.heartbeat:
            beat = threading.Thread(target=ctx._heartbeat, name=f"idempotency-heartbeat-{scope}/{key}", daemon=True)
            beat.start()
        token = c.set_current(ctx)
        try:
            value = work(ctx)
        except Exception as exc:
            ctx._stopped.set()
            if ctx.lost.is_set():
                raise (ctx.lost_reason or c.lease_lost(scope, key)) from exc
            try:
                self._call(self.stub.Complete, c.failure_request(scope, key, ctx.token, exc, opts), opts, opts.timeout)
            except CoordinatorError as err:
                if c.is_lease_error(err):
                    raise c.lease_lost(scope, key, err) from exc
                log.warning("could not record the failure of %s/%s: %s", scope, key, err)
            raise
        finally:
            ctx._stopped.set()
            c.reset_current(token)
        if ctx.lost.is_set():
            raise ctx.lost_reason or c.lease_lost(scope, key)
        try:
            done = self._call(self.stub.Complete, c.success_request(scope, key, ctx.token, value, opts), opts, opts.timeout)
        except CoordinatorError as err:
            if c.is_lease_error(err):
                raise c.lease_lost(scope, key, err) from None
            raise
        lease = c.lease_info(resp.lease)
        return c.RunResult(value=value, replayed=False, record=done.record, lease=lease)
