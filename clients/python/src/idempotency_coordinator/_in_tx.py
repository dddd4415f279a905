"""``run_once(..., connection=conn)``: the work's writes and the record's
SUCCEEDED committed together, in the caller's psycopg 3 transaction
(docs/in-transaction.md).

Acquire goes to the coordinator as in ``run_once``. The work runs inside
``connection.transaction()``, and ``idempotency_complete_in_tx`` runs last
in that block: inside the caller's own transaction (an outer
``with conn.transaction():`` block, or one a previous ``execute`` opened)
the block is a savepoint and the caller commits; on a connection with no
transaction in progress the block is a transaction of its own, committed
when it ends. psycopg is not imported here: the connection is the caller's.
"""

from __future__ import annotations

from typing import Any, Optional

import grpc

from ._errors import CoordinatorError, IdempotencyError, LeaseLost
from ._proto.idempotency.v1 import coordinator_pb2 as pb

__all__ = ["complete", "refusal", "succeeded"]

_SELECT = "SELECT status FROM {}(%s, %s, %s, %s::uuid, %s, %s, %s, %s)"


def _function(schema: Optional[str]) -> str:
    if schema is None:
        return "idempotency_complete_in_tx"
    return '"' + schema.replace('"', '""') + '".idempotency_complete_in_tx'


def complete(connection: Any, tenant: str, schema: Optional[str], req: pb.CompleteRequest) -> None:
    """``idempotency_complete_in_tx`` for the success ``req`` carries, on
    ``connection`` (in the caller's transaction)."""
    success = req.success
    connection.execute(
        _SELECT.format(_function(schema)),
        (tenant, req.scope, req.key, req.lease_token, success.result, success.content_type, 0, ""),
    )


def refusal(exc: BaseException, scope: str, key: str) -> Optional[IdempotencyError]:
    """The error a refused completion means (by its SQLSTATE), or None for
    any other failure."""
    state = getattr(exc, "sqlstate", None)
    diag = getattr(exc, "diag", None)
    message = str(getattr(diag, "message_primary", None) or exc)
    if state == "IK002":
        return LeaseLost(scope=scope, key=key, reason="LEASE_LOST", detail=message)
    if state == "IK001":
        return CoordinatorError(grpc.StatusCode.NOT_FOUND, message, reason="RECORD_NOT_FOUND")
    if state == "IK003":
        return CoordinatorError(grpc.StatusCode.FAILED_PRECONDITION, message, reason="ALREADY_COMPLETED")
    if state == "22023":
        return CoordinatorError(grpc.StatusCode.INVALID_ARGUMENT, message, reason="RESULT_REFUSED")
    return None


def succeeded(record: pb.Record, req: pb.CompleteRequest) -> pb.Record:
    """The Acquire's record as the completion left it."""
    done = pb.Record()
    done.CopyFrom(record)
    done.status = pb.STATUS_SUCCEEDED
    done.result.CopyFrom(req.success)
    done.ClearField("lease_expires_at")
    return done
