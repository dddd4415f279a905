export { createClient, DEFAULT_CALL_TIMEOUT_MS } from "./client.js";
export type { ClientOptions, CoordinatorClient, TlsOptions } from "./client.js";
export { runOnceInTransaction } from "./in-transaction.js";
export type { InTransactionOptions, SqlConnection } from "./in-transaction.js";
export {
  runOnce,
  isRetryable,
  DEFAULT_LEASE_TTL_MS,
  DEFAULT_WAIT_MS,
  DEFAULT_MAX_RETRIES,
} from "./run-once.js";
export type {
  ConflictOutcome,
  DoneOutcome,
  ExhaustedOutcome,
  FingerprintOptions,
  InProgressOutcome,
  LeaseContext,
  LeaseLostOutcome,
  RetryLaterOutcome,
  RunOnceClient,
  RunOnceOptions,
  RunOnceOutcome,
  Work,
} from "./run-once.js";
export { CoordinatorError, PermanentError, RetryableError, grpcCodeName } from "./errors.js";
export type { FieldViolation } from "./errors.js";
export { jsonCodec, bytesCodec, textCodec } from "./codec.js";
export type { Codec } from "./codec.js";
export { Coordinator, Decision, Status } from "./gen/idempotency/v1/coordinator_pb.js";
export type { Record as CoordinatorRecord, Lease } from "./gen/idempotency/v1/coordinator_pb.js";
