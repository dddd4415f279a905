import type { DescMessage, MessageShape } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import {
  BadRequestSchema,
  ErrorInfoSchema,
  RetryInfoSchema,
} from "./gen/google/rpc/error_details_pb.js";

/** One bad field of a request, from the error's google.rpc.BadRequest. */
export interface FieldViolation {
  readonly field: string;
  readonly description: string;
}

/** The gRPC status name of a code, for example "INVALID_ARGUMENT". */
export function grpcCodeName(code: Code): string {
  const name = Code[code];
  if (name === undefined) return `CODE_${code}`;
  if (code === Code.Canceled) return "CANCELLED";
  return name.replace(/([a-z])([A-Z])/g, "$1_$2").toUpperCase();
}

/**
 * A call to the coordinator that failed (as opposed to an outcome, which
 * `runOnce` returns). Carries the gRPC code and what the google.rpc details
 * attached to the status say: the ErrorInfo `reason` (stable, domain
 * `idempotency.v1`), the BadRequest field violations and the RetryInfo delay.
 */
export class CoordinatorError extends Error {
  override readonly name = "CoordinatorError";
  /** The status code (Connect's `Code`, numerically the gRPC code). */
  readonly code: Code;
  /** The gRPC name of `code`, for example "UNAVAILABLE". */
  readonly codeName: string;
  /** ErrorInfo.reason, for example "LEASE_LOST"; undefined when the error carried none. */
  readonly reason: string | undefined;
  /** ErrorInfo.domain ("idempotency.v1" for the coordinator's own errors). */
  readonly domain: string | undefined;
  /** ErrorInfo.metadata. */
  readonly metadata: Readonly<{ [key: string]: string }>;
  /** BadRequest.field_violations (empty when none). */
  readonly fieldViolations: readonly FieldViolation[];
  /** RetryInfo.retry_delay in milliseconds; undefined when the error carried none. */
  readonly retryAfterMs: number | undefined;
  /** The message without the code in front. */
  readonly rawMessage: string;
  /** The RPC that failed, for example "Acquire". */
  readonly rpc: string | undefined;
  /**
   * Set when runOnce's work returned a value and only the Complete that
   * would store it failed: the work ran, and this is what it returned.
   */
  unrecorded?: { readonly value: unknown };

  constructor(error: ConnectError, rpc?: string) {
    super(
      `${rpc === undefined ? "" : `${rpc}: `}${grpcCodeName(error.code)}` +
        `${error.rawMessage === "" ? "" : `: ${error.rawMessage}`}`,
      { cause: error },
    );
    this.code = error.code;
    this.codeName = grpcCodeName(error.code);
    this.rawMessage = error.rawMessage;
    this.rpc = rpc;
    const info = safeFind(error, ErrorInfoSchema)[0];
    this.reason = info?.reason === "" ? undefined : info?.reason;
    this.domain = info?.domain === "" ? undefined : info?.domain;
    this.metadata = { ...(info?.metadata ?? {}) };
    this.fieldViolations = safeFind(error, BadRequestSchema).flatMap((bad) =>
      bad.fieldViolations.map((v) => ({ field: v.field, description: v.description })),
    );
    const delay = safeFind(error, RetryInfoSchema)[0]?.retryDelay;
    this.retryAfterMs =
      delay === undefined ? undefined : Number(delay.seconds) * 1000 + Math.floor(delay.nanos / 1e6);
  }

  /** Wraps any error thrown by a Connect call (or returns a CoordinatorError as it is). */
  static from(error: unknown, rpc?: string): CoordinatorError {
    if (error instanceof CoordinatorError) return error;
    return new CoordinatorError(ConnectError.from(error), rpc);
  }
}

function safeFind<D extends DescMessage>(error: ConnectError, desc: D): MessageShape<D>[] {
  try {
    return error.findDetails(desc);
  } catch {
    // A detail that does not decode is ignored rather than hiding the error.
    return [];
  }
}

/**
 * Throw this (or an error the `isPermanent` classifier accepts) from the work
 * to report a permanent failure: the record becomes FAILED_PERMANENT and later
 * calls get the `exhausted` outcome instead of running the work again.
 */
export class PermanentError extends Error {
  override readonly name: string = "PermanentError";
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
  }
}

/**
 * Throw this from the work to report a retryable failure whose retry should
 * come due after `retryAfterMs` instead of the server's backoff.
 */
export class RetryableError extends Error {
  override readonly name: string = "RetryableError";
  readonly retryAfterMs: number;
  constructor(message: string, options: { retryAfterMs: number; cause?: unknown }) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.retryAfterMs = options.retryAfterMs;
  }
}
