"""What the sync and asyncio clients share: options, requests, decisions."""

from __future__ import annotations

import contextvars
import dataclasses
import datetime
import json
import random
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Optional, Tuple, TypeVar, Union

import grpc
from google.protobuf.duration_pb2 import Duration

from ._codec import Codec, JsonCodec
from ._errors import (
    Conflict,
    CoordinatorError,
    Exhausted,
    IdempotencyError,
    InProgress,
    LeaseLost,
    PermanentError,
    RetryLater,
    TransientError,
)
from ._proto.idempotency.v1 import coordinator_pb2 as pb

T = TypeVar("T")

Seconds = Union[datetime.timedelta, float, int]
"""A duration: a :class:`datetime.timedelta` or a number of seconds."""

Metadata = Tuple[Tuple[str, str], ...]

_RETRYABLE_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
_RETRYABLE_EXHAUSTED = ("SERVER_BUSY", "TOO_MANY_WAITERS")
_LEASE_REASONS = ("LEASE_LOST", "LEASE_EXPIRED")


def to_timedelta(value: Seconds) -> datetime.timedelta:
    if isinstance(value, datetime.timedelta):
        return value
    return datetime.timedelta(seconds=float(value))


def to_duration(value: datetime.timedelta) -> Duration:
    d = Duration()
    d.FromTimedelta(value)
    return d


MIN_EXTENSION = datetime.timedelta(seconds=1)
"""The shortest ExtendLease the server accepts."""


def extend_request(scope: str, key: str, token: str, since_granted: float) -> pb.ExtendLeaseRequest:
    """A heartbeat's ExtendLease: by the seconds since the expiry the server
    last granted was asked for (at least the server's minimum). The new
    expiry is the old one plus that, so the lease stays about one TTL ahead
    of now instead of growing by a TTL at every heartbeat."""
    return pb.ExtendLeaseRequest(
        scope=scope,
        key=key,
        lease_token=token,
        extend_by=to_duration(max(datetime.timedelta(seconds=since_granted), MIN_EXTENSION)),
    )


@dataclass(frozen=True)
class Options:
    """How ``run_once`` behaves. Every field can be given to the client (its
    default for every call) and to each ``run_once`` (for that call)."""

    wait: datetime.timedelta = datetime.timedelta(seconds=10)
    lease_ttl: datetime.timedelta = datetime.timedelta(seconds=60)
    heartbeat: bool = True
    heartbeat_interval: Optional[datetime.timedelta] = None
    call_timeout: datetime.timedelta = datetime.timedelta(seconds=10)
    max_retries: int = 5
    backoff_initial: datetime.timedelta = datetime.timedelta(milliseconds=100)
    backoff_max: datetime.timedelta = datetime.timedelta(seconds=2)
    max_attempts: Optional[int] = None
    retention: Optional[datetime.timedelta] = None
    codec: Codec = field(default_factory=JsonCodec)
    is_permanent: Optional[Callable[[BaseException], bool]] = None

    _DURATIONS = (
        "wait",
        "lease_ttl",
        "heartbeat_interval",
        "call_timeout",
        "backoff_initial",
        "backoff_max",
        "retention",
    )

    def merged(self, **overrides: Any) -> "Options":
        if not overrides:
            return self
        known = {f.name for f in dataclasses.fields(self)}
        unknown = set(overrides) - known
        if unknown:
            raise TypeError(f"unknown option(s): {', '.join(sorted(unknown))}")
        clean = {}
        for name, value in overrides.items():
            if name in self._DURATIONS and value is not None:
                value = to_timedelta(value)
            clean[name] = value
        opts = dataclasses.replace(self, **clean)
        opts.validate()
        return opts

    def validate(self) -> None:
        if self.lease_ttl < datetime.timedelta(seconds=1):
            raise ValueError("lease_ttl must be at least 1 second")
        if self.wait < datetime.timedelta(0):
            raise ValueError("wait must not be negative")
        if self.max_retries < 0:
            raise ValueError("max_retries must not be negative")
        if self.heartbeat_interval is not None and self.heartbeat_interval <= datetime.timedelta(0):
            raise ValueError("heartbeat_interval must be positive")

    @property
    def interval(self) -> float:
        """Seconds between heartbeats."""
        if self.heartbeat_interval is not None:
            return self.heartbeat_interval.total_seconds()
        return self.lease_ttl.total_seconds() / 3

    @property
    def acquire_timeout(self) -> float:
        return (self.wait + self.call_timeout).total_seconds()

    @property
    def timeout(self) -> float:
        return self.call_timeout.total_seconds()

    def backoff(self, retry: int, server_delay: Optional[datetime.timedelta]) -> float:
        """Seconds before retry number ``retry`` (0-based): doubling from
        ``backoff_initial`` to ``backoff_max`` with jitter (half to all of
        it), never shorter than the server's RetryInfo delay."""
        base = self.backoff_initial.total_seconds() * float(2 ** min(retry, 30))
        base = min(base, self.backoff_max.total_seconds())
        delay: float = base / 2 + random.uniform(0, base / 2)
        if server_delay is not None:
            delay = max(delay, server_delay.total_seconds())
        return delay


def build_options(**kwargs: Any) -> Options:
    return Options().merged(**kwargs)


def is_retryable(err: CoordinatorError) -> bool:
    """Whether a call may be sent again as it was: its reply may have been
    lost, or the server asked us to come back."""
    if err.code in _RETRYABLE_CODES:
        return True
    return err.code == grpc.StatusCode.RESOURCE_EXHAUSTED and err.reason in _RETRYABLE_EXHAUSTED


def is_lease_error(err: CoordinatorError) -> bool:
    return err.code == grpc.StatusCode.ABORTED and err.reason in _LEASE_REASONS


def auth_metadata(bearer_token: Optional[str]) -> Metadata:
    if bearer_token is None:
        return ()
    return (("authorization", f"Bearer {bearer_token}"),)


def new_request_id() -> str:
    return uuid.uuid4().hex


def acquire_request(
    scope: str,
    key: str,
    opts: Options,
    request_id: str,
    *,
    fingerprint: Optional[str],
    payload: Optional[bytes],
    json_payload: Any,
) -> pb.AcquireRequest:
    given = sum(x is not None for x in (fingerprint, payload, json_payload))
    if given > 1:
        raise ValueError("give at most one of fingerprint, payload and json_payload")
    req = pb.AcquireRequest(
        scope=scope,
        key=key,
        lease_ttl=to_duration(opts.lease_ttl),
        request_id=request_id,
    )
    if opts.wait > datetime.timedelta(0):
        req.wait.CopyFrom(to_duration(opts.wait))
    if opts.max_attempts is not None:
        req.max_attempts = opts.max_attempts
    if opts.retention is not None:
        req.retention.CopyFrom(to_duration(opts.retention))
    if fingerprint is not None:
        req.fingerprint = fingerprint
    elif payload is not None:
        req.payload = bytes(payload)
    elif json_payload is not None:
        if isinstance(json_payload, (bytes, bytearray)):
            req.json_payload = bytes(json_payload).decode("utf-8")
        elif isinstance(json_payload, str):
            req.json_payload = json_payload
        else:
            req.json_payload = json.dumps(json_payload, separators=(",", ":"))
    return req


@dataclass(frozen=True)
class LeaseInfo:
    """The lease a fresh result was produced under."""

    token: str
    attempt: int
    fencing_token: int
    expires_at: datetime.datetime


def lease_info(lease: pb.Lease) -> LeaseInfo:
    return LeaseInfo(
        token=lease.token,
        attempt=lease.attempt,
        fencing_token=lease.fencing_token,
        expires_at=lease.expires_at.ToDatetime(tzinfo=datetime.timezone.utc),
    )


@dataclass(frozen=True)
class RunResult(Generic[T]):
    """What ``run_once`` returns: the value, whether it was replayed from an
    earlier run (``replayed``) or produced now (then ``lease`` is the lease
    it ran under), and the record as it stands."""

    value: T
    replayed: bool
    record: pb.Record
    lease: Optional[LeaseInfo] = None

    @property
    def fresh(self) -> bool:
        return not self.replayed


def replay(resp: pb.AcquireResponse, opts: Options) -> "RunResult[Any]":
    res = resp.record.result
    value = opts.codec.decode(res.result, res.content_type)
    return RunResult(value=value, replayed=True, record=resp.record)


def raise_outcome(resp: pb.AcquireResponse, scope: str, key: str) -> None:
    """Raise the typed outcome for a decision that is neither PROCEED nor
    ALREADY_DONE."""
    d = resp.decision
    record = resp.record if resp.HasField("record") else None
    retry_after = resp.retry_after.ToTimedelta()
    if d == pb.DECISION_IN_PROGRESS:
        raise InProgress(scope=scope, key=key, retry_after=retry_after, record=record)
    if d == pb.DECISION_RETRY_LATER:
        raise RetryLater(scope=scope, key=key, retry_after=retry_after, record=record)
    if d == pb.DECISION_CONFLICT:
        raise Conflict(scope=scope, key=key, record=record)
    if d == pb.DECISION_EXHAUSTED:
        raise Exhausted(scope=scope, key=key, record=record)
    raise CoordinatorError(
        grpc.StatusCode.UNKNOWN, f"unexpected decision {pb.Decision.Name(d) if d in pb.Decision.values() else d}"
    )


def success_request(scope: str, key: str, token: str, value: Any, opts: Options) -> pb.CompleteRequest:
    return pb.CompleteRequest(
        scope=scope,
        key=key,
        lease_token=token,
        success=pb.Success(result=opts.codec.encode(value), content_type=opts.codec.content_type),
    )


def failure_request(scope: str, key: str, token: str, exc: BaseException, opts: Options) -> pb.CompleteRequest:
    permanent = isinstance(exc, PermanentError)
    if not permanent and opts.is_permanent is not None:
        permanent = bool(opts.is_permanent(exc))
    text = str(exc)
    error = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    failure = pb.Failure(error=error[:4000], permanent=permanent)
    if isinstance(exc, TransientError) and exc.retry_after is not None:
        failure.retry_after.CopyFrom(to_duration(exc.retry_after))
    return pb.CompleteRequest(scope=scope, key=key, lease_token=token, failure=failure)


E = TypeVar("E", bound=IdempotencyError)


def unrecorded(err: E, value: Any) -> E:
    """``err``, carrying the value the work returned that ``err`` kept from
    being stored."""
    err.unrecorded_value = value
    err.has_unrecorded_value = True
    return err


def lease_lost(scope: str, key: str, err: Optional[CoordinatorError] = None) -> LeaseLost:
    if err is None:
        return LeaseLost(scope=scope, key=key)
    return LeaseLost(scope=scope, key=key, reason=err.reason or "LEASE_LOST", detail=err.message)


_current: "contextvars.ContextVar[Any]" = contextvars.ContextVar("idempotency_lease", default=None)


def set_current(ctx: Any) -> "contextvars.Token[Any]":
    return _current.set(ctx)


def reset_current(token: "contextvars.Token[Any]") -> None:
    _current.reset(token)


def current() -> Any:
    return _current.get()
