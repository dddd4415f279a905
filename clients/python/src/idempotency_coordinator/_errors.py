"""Typed outcomes and errors.

Every decision other than a result (PROCEED that ran, or ALREADY_DONE) is an
:class:`OutcomeError`; every failed call that is not an outcome is a
:class:`CoordinatorError` carrying the gRPC code and the ``google.rpc``
details the server attached.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import grpc
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2

from ._proto.idempotency.v1 import coordinator_pb2 as pb

__all__ = [
    "IdempotencyError",
    "OutcomeError",
    "InProgress",
    "RetryLater",
    "Conflict",
    "Exhausted",
    "LeaseLost",
    "CoordinatorError",
    "FieldViolation",
    "PermanentError",
    "TransientError",
]

_DETAILS_KEY = "grpc-status-details-bin"


class IdempotencyError(Exception):
    """Base of every exception this library raises of its own.

    When ``run_once``'s work returned a value but the Complete that would
    have stored it failed (:class:`LeaseLost`, or a :class:`CoordinatorError`
    after its retries), the work did run: ``has_unrecorded_value`` is True
    and ``unrecorded_value`` is what it returned, not stored."""

    #: What the work returned, when only its Complete failed.
    unrecorded_value: Any = None
    #: Whether ``unrecorded_value`` holds the work's value.
    has_unrecorded_value: bool = False


class OutcomeError(IdempotencyError):
    """A decision other than "here is the result": the work did not run to a
    stored result in this call. ``record`` is the record as the server
    reported it, when it did."""

    def __init__(self, message: str, *, scope: str, key: str, record: Optional[pb.Record]) -> None:
        super().__init__(message)
        self.scope = scope
        self.key = key
        self.record = record


class InProgress(OutcomeError):
    """Another caller holds a live lease, still after the wait window. Ask
    again after ``retry_after``."""

    def __init__(self, *, scope: str, key: str, retry_after: datetime.timedelta, record: Optional[pb.Record]) -> None:
        super().__init__(
            f"{scope}/{key} is in progress elsewhere; retry after {retry_after.total_seconds():.3f}s",
            scope=scope,
            key=key,
            record=record,
        )
        self.retry_after = retry_after


class RetryLater(OutcomeError):
    """The last attempt failed and its retry is not due yet."""

    def __init__(self, *, scope: str, key: str, retry_after: datetime.timedelta, record: Optional[pb.Record]) -> None:
        last = record.last_error if record is not None else ""
        super().__init__(
            f"{scope}/{key} failed before ({last!r}); retry after {retry_after.total_seconds():.3f}s",
            scope=scope,
            key=key,
            record=record,
        )
        self.retry_after = retry_after
        self.last_error = last


class Conflict(OutcomeError):
    """The key was first used with a different fingerprint: another request
    reuses it. ``record`` is the record the key belongs to."""

    def __init__(self, *, scope: str, key: str, record: Optional[pb.Record]) -> None:
        fp = record.fingerprint if record is not None else ""
        super().__init__(
            f"{scope}/{key} belongs to a different request (fingerprint {fp!r})",
            scope=scope,
            key=key,
            record=record,
        )


class Exhausted(OutcomeError):
    """No attempts left, or a holder reported a permanent failure."""

    def __init__(self, *, scope: str, key: str, record: Optional[pb.Record]) -> None:
        last = record.last_error if record is not None else ""
        super().__init__(f"{scope}/{key} is exhausted: {last}", scope=scope, key=key, record=record)
        self.last_error = last


class LeaseLost(OutcomeError):
    """The lease was taken over (or ran out) while the work ran, or the late
    Complete was refused. The result was not stored by this caller.

    ``reason`` is the server's ErrorInfo reason (``LEASE_LOST`` or
    ``LEASE_EXPIRED``)."""

    def __init__(
        self,
        *,
        scope: str,
        key: str,
        reason: str = "LEASE_LOST",
        record: Optional[pb.Record] = None,
        detail: str = "",
    ) -> None:
        msg = f"lease on {scope}/{key} lost ({reason})"
        if detail:
            msg += f": {detail}"
        super().__init__(msg, scope=scope, key=key, record=record)
        self.reason = reason


@dataclass(frozen=True)
class FieldViolation:
    """One ``google.rpc.BadRequest`` field violation."""

    field: str
    description: str


class CoordinatorError(IdempotencyError):
    """A call failed and the failure is not an outcome (a bad argument, bad
    credentials, the database down beyond the retries...).

    ``code`` is the gRPC status code; ``reason``, ``domain`` and ``metadata``
    come from the ``google.rpc.ErrorInfo``, ``field_violations`` from
    ``google.rpc.BadRequest`` and ``retry_after`` from ``google.rpc.RetryInfo``
    (each empty/None when the server sent none)."""

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        *,
        reason: Optional[str] = None,
        domain: Optional[str] = None,
        metadata: Optional[Dict[str, str]] = None,
        field_violations: Sequence[FieldViolation] = (),
        retry_after: Optional[datetime.timedelta] = None,
    ) -> None:
        text = f"{code.name}"
        if reason:
            text += f" ({reason})"
        if message:
            text += f": {message}"
        if field_violations:
            text += " [" + "; ".join(f"{v.field}: {v.description}" for v in field_violations) + "]"
        super().__init__(text)
        self.code = code
        self.message = message
        self.reason = reason
        self.domain = domain
        self.metadata: Dict[str, str] = dict(metadata or {})
        self.field_violations: List[FieldViolation] = list(field_violations)
        self.retry_after = retry_after

    @classmethod
    def from_rpc_error(cls, err: grpc.RpcError) -> "CoordinatorError":
        """Decode a failed call, sync or ``grpc.aio``."""
        code = _call_attr(err, "code", grpc.StatusCode.UNKNOWN)
        if not isinstance(code, grpc.StatusCode):
            code = grpc.StatusCode.UNKNOWN
        message = _call_attr(err, "details", "") or ""
        trailers = _call_attr(err, "trailing_metadata", None) or ()
        reason = domain = None
        meta: Dict[str, str] = {}
        violations: List[FieldViolation] = []
        retry_after: Optional[datetime.timedelta] = None
        for k, v in _pairs(trailers):
            if k != _DETAILS_KEY or not isinstance(v, bytes):
                continue
            status = status_pb2.Status()
            try:
                status.ParseFromString(v)
            except DecodeError:
                continue
            if status.message:
                message = status.message
            for any_ in status.details:
                info = error_details_pb2.ErrorInfo()
                bad = error_details_pb2.BadRequest()
                retry = error_details_pb2.RetryInfo()
                if any_.Is(info.DESCRIPTOR) and any_.Unpack(info):
                    reason, domain, meta = info.reason, info.domain, dict(info.metadata)
                elif any_.Is(bad.DESCRIPTOR) and any_.Unpack(bad):
                    violations.extend(FieldViolation(fv.field, fv.description) for fv in bad.field_violations)
                elif any_.Is(retry.DESCRIPTOR) and any_.Unpack(retry):
                    retry_after = retry.retry_delay.ToTimedelta()
        return cls(
            code,
            message,
            reason=reason,
            domain=domain,
            metadata=meta,
            field_violations=violations,
            retry_after=retry_after,
        )


class PermanentError(Exception):
    """Raise it (or a subclass) from the work to report a permanent failure:
    the record becomes FAILED_PERMANENT and later calls get
    :class:`Exhausted`."""


class TransientError(Exception):
    """Raise it from the work to report a failure whose retry should come
    due after ``retry_after`` rather than after the server's backoff."""

    def __init__(self, message: str, *, retry_after: Optional[datetime.timedelta] = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def _call_attr(err: object, name: str, default: Any) -> Any:
    fn = getattr(err, name, None)
    if fn is None:
        return default
    try:
        return fn()
    except Exception:  # an RpcError that is not a Call
        return default


def _pairs(md: Any) -> List[Tuple[str, Any]]:
    out: List[Tuple[str, Any]] = []
    for item in md:
        if isinstance(item, tuple) and len(item) == 2:
            out.append((str(item[0]), item[1]))
        else:
            out.append((str(getattr(item, "key", "")), getattr(item, "value", None)))
    return out
