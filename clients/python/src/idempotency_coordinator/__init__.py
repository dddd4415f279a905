"""Run each side-effecting operation exactly once, through the idempotency
coordinator.

    from idempotency_coordinator import Client

    with Client.connect("127.0.0.1:50051") as client:
        result = client.run_once("payments.charge", order.id, lambda ctx: charge(order))
        print(result.value, result.replayed)
"""

from ._aio import AsyncClient, AsyncLeaseContext
from ._codec import BytesCodec, Codec, JsonCodec
from ._common import LeaseInfo, Options, RunResult, Seconds
from ._decorator import current_lease, idempotent
from ._errors import (
    Conflict,
    CoordinatorError,
    Exhausted,
    FieldViolation,
    IdempotencyError,
    InProgress,
    LeaseLost,
    OutcomeError,
    PermanentError,
    RetryLater,
    TransientError,
)
from ._proto.idempotency.v1 import coordinator_pb2 as pb
from ._proto.idempotency.v1 import coordinator_pb2_grpc as pb_grpc
from ._sync import Client, LeaseContext

__version__ = "0.1.0"

__all__ = [
    "AsyncClient",
    "AsyncLeaseContext",
    "BytesCodec",
    "Client",
    "Codec",
    "Conflict",
    "CoordinatorError",
    "Exhausted",
    "FieldViolation",
    "IdempotencyError",
    "InProgress",
    "JsonCodec",
    "LeaseContext",
    "LeaseInfo",
    "LeaseLost",
    "Options",
    "OutcomeError",
    "PermanentError",
    "RetryLater",
    "RunResult",
    "Seconds",
    "TransientError",
    "current_lease",
    "idempotent",
    "pb",
    "pb_grpc",
]
