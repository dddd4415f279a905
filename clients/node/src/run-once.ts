import { randomUUID } from "node:crypto";
import { setTimeout as sleepFor } from "node:timers/promises";
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { Duration, DurationSchema, Timestamp } from "@bufbuild/protobuf/wkt";
import { Code, type Client } from "@connectrpc/connect";
import { jsonCodec, type Codec } from "./codec.js";
import { CoordinatorError, PermanentError, RetryableError } from "./errors.js";
import {
  Decision,
  type Coordinator,
  type AcquireRequestSchema,
  type CompleteRequestSchema,
  type Lease,
  type Record as CoordinatorRecord,
} from "./gen/idempotency/v1/coordinator_pb.js";

/**
 * What `runOnce` needs of a client: its generated stub and its calls'
 * deadline. A `CoordinatorClient` (`createClient`) is one.
 */
export interface RunOnceClient {
  readonly stub: Client<typeof Coordinator>;
  /** The deadline of each call, in milliseconds. */
  readonly callTimeoutMs: number;
}

/** Defaults of `runOnce`, the same in every client library. */
export const DEFAULT_LEASE_TTL_MS = 60_000;
export const DEFAULT_WAIT_MS = 10_000;
export const DEFAULT_MAX_RETRIES = 5;
const BACKOFF_BASE_MS = 100;
const BACKOFF_CAP_MS = 2_000;
const MAX_ERROR_TEXT = 4000;

/** What the work is given while it holds the lease. */
export interface LeaseContext {
  readonly scope: string;
  readonly key: string;
  /** The lease token (secret: it proves the right to Complete). */
  readonly token: string;
  /** Which attempt this is, counting from 1. */
  readonly attempt: number;
  /** Pass it to downstream writes, so that a stale holder's late write can be refused there. */
  readonly fencingToken: bigint;
  /** What an earlier holder (or this one) saved with `saveCheckpoint`; empty when none. */
  readonly checkpoint: Uint8Array;
  /** When the lease runs out as last heard from the server (its clock). */
  readonly expiresAt: Date | undefined;
  /**
   * Aborts when the lease is lost (its reason is the CoordinatorError the
   * heartbeat got) or when the caller's own `signal` aborts. Stop the work
   * then: its result will not be stored.
   */
  readonly signal: AbortSignal;
  /** Saves progress on the record (ExtendLease with a checkpoint); also extends the lease. */
  saveCheckpoint(checkpoint: Uint8Array): Promise<void>;
}

/** The operation to run at most once per key. */
export type Work<T> = (lease: LeaseContext) => Promise<T> | T;

/** What the request is about: at most one of these; none means no fingerprint. */
export type FingerprintOptions =
  | { readonly fingerprint?: string; readonly payload?: undefined; readonly jsonPayload?: undefined }
  | { readonly payload: Uint8Array; readonly fingerprint?: undefined; readonly jsonPayload?: undefined }
  | { readonly jsonPayload: string; readonly fingerprint?: undefined; readonly payload?: undefined };

export type RunOnceOptions<T> = FingerprintOptions & {
  /** The operation, e.g. "payments.charge": 1-128 of [A-Za-z0-9._:/-]. */
  readonly scope: string;
  /** The idempotency key: 1-255 visible ASCII characters. */
  readonly key: string;
  /** Lease TTL (60 000 unless set; at least 1 000). */
  readonly leaseTtlMs?: number;
  /** How long Acquire waits for another holder to finish (10 000 unless set; 0: answer at once). */
  readonly waitMs?: number;
  /** Heartbeat period (a third of the lease TTL unless set); `false` turns the heartbeat off. */
  readonly heartbeatIntervalMs?: number | false;
  /** How often a failed Acquire or Complete is sent again (5 unless set). */
  readonly maxRetries?: number;
  /** Attempts the record allows in all (the server's default unless set); fixed at creation. */
  readonly maxAttempts?: number;
  /** How long the record is kept after its last change (the server's default unless set). */
  readonly retentionMs?: number;
  /** The Acquire request_id (a random UUID unless set). */
  readonly requestId?: string;
  /** How the result is stored and replayed (JSON unless set). */
  readonly codec?: Codec<T>;
  /** Says which errors thrown by the work are permanent (besides PermanentError). */
  readonly isPermanent?: (error: unknown) => boolean;
  /** Cancels the Acquire and its retries, and aborts the work's `lease.signal`. */
  readonly signal?: AbortSignal;
};

/** The work ran now (`replayed: false`) or earlier (`replayed: true`, the stored result decoded). */
export interface DoneOutcome<T> {
  readonly kind: "done";
  readonly value: T;
  readonly replayed: boolean;
  readonly record: CoordinatorRecord;
}
/** Another caller still holds the lease after the wait window. */
export interface InProgressOutcome {
  readonly kind: "in_progress";
  readonly retryAfterMs: number;
  readonly record: CoordinatorRecord;
}
/** The last attempt failed and its retry is not due yet. */
export interface RetryLaterOutcome {
  readonly kind: "retry_later";
  readonly retryAfterMs: number;
  readonly record: CoordinatorRecord;
}
/** The key belongs to a different request (another fingerprint). */
export interface ConflictOutcome {
  readonly kind: "conflict";
  readonly record: CoordinatorRecord;
}
/** No attempts are left, or a permanent failure was reported. */
export interface ExhaustedOutcome {
  readonly kind: "exhausted";
  readonly lastError: string;
  readonly record: CoordinatorRecord;
}
/** The lease was taken over while the work ran, or the late Complete was refused; nothing was stored. */
export interface LeaseLostOutcome<T = unknown> {
  readonly kind: "lease_lost";
  /** "LEASE_LOST" or "LEASE_EXPIRED". */
  readonly reason: string;
  readonly error: CoordinatorError;
  readonly attempt: number;
  readonly fencingToken: bigint;
  /** What the work threw, when it threw (typically an AbortError after its signal fired). */
  readonly workError?: unknown;
  /**
   * What the work returned, when it returned (`"value" in outcome`): the
   * work ran, and its value was not stored.
   */
  readonly value?: T;
}

export type RunOnceOutcome<T> =
  | DoneOutcome<T>
  | InProgressOutcome
  | RetryLaterOutcome
  | ConflictOutcome
  | ExhaustedOutcome
  | LeaseLostOutcome<T>;

/**
 * Runs `work` at most once for (scope, key) across every caller of the
 * coordinator: Acquire (retried with the same request_id), the work under a
 * heartbeat, then Complete. Outcomes other than running the work are returned
 * as typed values; the work's own error is thrown again after it is reported;
 * a call that cannot be answered throws CoordinatorError.
 */
export async function runOnce<T>(
  client: RunOnceClient,
  options: RunOnceOptions<T>,
  work: Work<T>,
): Promise<RunOnceOutcome<T>> {
  return runOnceWith(client, options, work, undefined);
}

/**
 * runOnce with the in-transaction hook (runOnceInTransaction's); not part
 * of the package's exports.
 * @internal
 */
export async function runOnceWith<T>(
  client: RunOnceClient,
  options: RunOnceOptions<T>,
  work: Work<T>,
  inTransaction: InTransaction | undefined,
): Promise<RunOnceOutcome<T>> {
  const leaseTtlMs = options.leaseTtlMs ?? DEFAULT_LEASE_TTL_MS;
  const waitMs = options.waitMs ?? DEFAULT_WAIT_MS;
  const maxRetries = options.maxRetries ?? DEFAULT_MAX_RETRIES;
  const heartbeatMs =
    options.heartbeatIntervalMs === undefined ? leaseTtlMs / 3 : options.heartbeatIntervalMs;
  if (!(leaseTtlMs > 0)) throw new RangeError("leaseTtlMs must be positive");
  if (!(waitMs >= 0)) throw new RangeError("waitMs must not be negative");
  if (!(Number.isInteger(maxRetries) && maxRetries >= 0)) {
    throw new RangeError("maxRetries must be a whole number, 0 or more");
  }
  if (heartbeatMs !== false && !(heartbeatMs > 0)) {
    throw new RangeError("heartbeatIntervalMs must be positive, or false for no heartbeat");
  }
  const codec = options.codec ?? (jsonCodec() as Codec<T>);
  const signal = options.signal;
  signal?.throwIfAborted();

  const request: MessageInitShape<typeof AcquireRequestSchema> = {
    scope: options.scope,
    key: options.key,
    leaseTtl: duration(leaseTtlMs),
    requestId: options.requestId ?? randomUUID(),
    requestFingerprint: fingerprintOf(options),
  };
  if (waitMs > 0) request.wait = duration(waitMs);
  if (options.maxAttempts !== undefined) request.maxAttempts = options.maxAttempts;
  if (options.retentionMs !== undefined) request.retention = duration(options.retentionMs);

  const acquireTimeoutMs = waitMs + client.callTimeoutMs;
  const response = await withRetries("Acquire", maxRetries, signal, () =>
    client.stub.acquire(request, callOptions(acquireTimeoutMs, signal)),
  );
  const record = response.record;
  if (record === undefined) throw new Error("Acquire answered without a record");
  switch (response.decision) {
    case Decision.PROCEED: {
      if (response.lease === undefined) throw new Error("Acquire answered PROCEED without a lease");
      return holdLease(
        client,
        options,
        work,
        codec,
        response.lease,
        record,
        { leaseTtlMs, heartbeatMs, maxRetries },
        inTransaction,
      );
    }
    case Decision.ALREADY_DONE: {
      const result = record.result;
      const value = codec.decode(result?.result ?? new Uint8Array(0), result?.contentType ?? "");
      return { kind: "done", value, replayed: true, record };
    }
    case Decision.IN_PROGRESS:
      return { kind: "in_progress", retryAfterMs: millis(response.retryAfter), record };
    case Decision.RETRY_LATER:
      return { kind: "retry_later", retryAfterMs: millis(response.retryAfter), record };
    case Decision.CONFLICT:
      return { kind: "conflict", record };
    case Decision.EXHAUSTED:
      return { kind: "exhausted", lastError: record.lastError, record };
    default:
      throw new Error(`Acquire answered an unknown decision ${String(response.decision)}`);
  }
}

/**
 * Where the work runs and its success is stored when the completion runs in
 * the caller's own transaction (`in-transaction.ts`) instead of a Complete.
 */
export interface InTransaction {
  /** Opens the savepoint the work runs in. */
  begin(): Promise<void>;
  /** Rolls the savepoint back (the work's writes are gone). */
  rollback(): Promise<void>;
  /** Stores the success in the savepoint, releases it, and returns the record as it left it. */
  complete(token: string, result: Uint8Array, contentType: string, record: CoordinatorRecord): Promise<CoordinatorRecord>;
  /** The CoordinatorError a refused completion stands for, or undefined for any other failure. */
  refusal(error: unknown): CoordinatorError | undefined;
}

/** The shortest ExtendLease the server accepts. */
const MIN_EXTENSION_MS = 1000;

async function holdLease<T>(
  client: RunOnceClient,
  options: RunOnceOptions<T>,
  work: Work<T>,
  codec: Codec<T>,
  lease: Lease,
  record: CoordinatorRecord,
  settings: { leaseTtlMs: number; heartbeatMs: number | false; maxRetries: number },
  inTransaction?: InTransaction,
): Promise<RunOnceOutcome<T>> {
  const { scope, key } = options;
  const token = lease.token;
  const controller = new AbortController();
  let lost: CoordinatorError | undefined;
  const markLost = (error: CoordinatorError): void => {
    if (lost === undefined) {
      lost = error;
      controller.abort(error);
    }
  };
  const callerSignal = options.signal;
  const onCallerAbort = (): void => controller.abort(callerSignal?.reason);
  callerSignal?.addEventListener("abort", onCallerAbort, { once: true });

  let checkpoint = record.checkpoint;
  let expiresAt = date(lease.expiresAt);
  // When the expiry last granted was asked for (monotonic clock). Each
  // extension adds the time since then (at least the server's minimum of one
  // second), so the lease stays about one TTL ahead of now instead of growing
  // by a TTL at every heartbeat.
  let grantedAt = performance.now();
  const extend = async (newCheckpoint?: Uint8Array): Promise<void> => {
    const sent = performance.now();
    const response = await client.stub.extendLease(
      {
        scope,
        key,
        leaseToken: token,
        extendBy: duration(Math.max(sent - grantedAt, MIN_EXTENSION_MS)),
        ...(newCheckpoint === undefined ? {} : { checkpoint: newCheckpoint }),
      },
      { timeoutMs: client.callTimeoutMs },
    );
    expiresAt = date(response.lease?.expiresAt) ?? expiresAt;
    grantedAt = Math.max(grantedAt, sent);
  };

  const heartbeat =
    settings.heartbeatMs === false ? undefined : startHeartbeat(settings.heartbeatMs, extend, markLost);

  const context: LeaseContext = {
    scope,
    key,
    token,
    attempt: lease.attempt,
    fencingToken: lease.fencingToken,
    get checkpoint() {
      return checkpoint;
    },
    get expiresAt() {
      return expiresAt;
    },
    signal: controller.signal,
    async saveCheckpoint(bytes: Uint8Array): Promise<void> {
      if (lost !== undefined) throw lost;
      try {
        await withRetries("ExtendLease", settings.maxRetries, undefined, () => extend(bytes));
      } catch (error) {
        if (error instanceof CoordinatorError && error.code === Code.Aborted) markLost(error);
        throw error;
      }
      checkpoint = bytes;
    },
  };

  let outcome: { ok: true; value: T } | { ok: false; error: unknown };
  // False while the caller's transaction refuses the savepoint (no BEGIN,
  // an aborted transaction): a database error before the work.
  let begun = inTransaction === undefined;
  try {
    await inTransaction?.begin();
    begun = true;
    outcome = { ok: true, value: await work(context) };
  } catch (error) {
    outcome = { ok: false, error };
  } finally {
    await heartbeat?.stop();
    callerSignal?.removeEventListener("abort", onCallerAbort);
  }
  // A failed (or fenced-off) work's writes never reach the caller's commit.
  if (!outcome.ok || lost !== undefined) await inTransaction?.rollback().catch(() => undefined);

  const leaseLost = (error: CoordinatorError): LeaseLostOutcome<T> => ({
    kind: "lease_lost",
    reason: error.reason ?? error.codeName,
    error,
    attempt: lease.attempt,
    fencingToken: lease.fencingToken,
    ...(outcome.ok ? { value: outcome.value } : { workError: outcome.error }),
  });
  // The heartbeat heard that another caller may run the work: never Complete.
  if (lost !== undefined) return leaseLost(lost);

  // Complete is sent even when the caller's signal aborted: it records what
  // happened, and it is bounded by its own deadline and retries.
  const complete = (
    completion: NonNullable<MessageInitShape<typeof CompleteRequestSchema>["outcome"]>,
  ) =>
    withRetries("Complete", settings.maxRetries, undefined, () =>
      client.stub.complete(
        { scope, key, leaseToken: token, outcome: completion },
        { timeoutMs: client.callTimeoutMs },
      ),
    );

  // The work did not start: nothing happened, give the key back.
  if (!begun && !outcome.ok) {
    await complete({ case: "release", value: {} }).catch(() => undefined);
    throw outcome.error;
  }

  if (outcome.ok) {
    const value = outcome.value;
    let result: Uint8Array | undefined;
    try {
      result = codec.encode(value);
    } catch (error) {
      outcome = { ok: false, error };
    }
    if (result !== undefined && inTransaction !== undefined) {
      try {
        const stored = await inTransaction.complete(token, result, codec.contentType, record);
        return { kind: "done", value, replayed: false, record: stored };
      } catch (error) {
        await inTransaction.rollback().catch(() => undefined);
        const refused = inTransaction.refusal(error);
        if (refused?.code === Code.Aborted) return leaseLost(refused);
        if (refused?.code === Code.InvalidArgument) {
          // The same value is refused every time: the key fails for good.
          await complete({
            case: "failure",
            value: { error: `the result was refused: ${refused.message}`, permanent: true },
          }).catch(() => undefined);
          throw refused;
        }
        // No record under this tenant (a wrong tenant, say): the lease is
        // still held, give it back.
        if (refused?.code === Code.NotFound) await complete({ case: "release", value: {} }).catch(() => undefined);
        if (refused !== undefined) throw refused;
        // The work's writes rolled back: nothing happened, give the key back.
        await complete({ case: "release", value: {} }).catch(() => undefined);
        throw error;
      }
    }
    if (result === undefined && inTransaction !== undefined) {
      await inTransaction.rollback().catch(() => undefined);
    }
    if (result !== undefined) {
      try {
        const response = await complete({
          case: "success",
          value: { result, contentType: codec.contentType },
        });
        const stored = response.record;
        if (stored === undefined) throw new Error("Complete answered without a record");
        return { kind: "done", value, replayed: false, record: stored };
      } catch (error) {
        if (error instanceof CoordinatorError && error.code === Code.Aborted) return leaseLost(error);
        // The work ran: its value goes back with the error.
        if (error instanceof CoordinatorError) error.unrecorded = { value };
        throw error;
      }
    }
  }

  const workError = (outcome as { ok: false; error: unknown }).error;
  const permanent = workError instanceof PermanentError || options.isPermanent?.(workError) === true;
  try {
    await complete({
      case: "failure",
      value: {
        error: describe(workError),
        permanent,
        ...(workError instanceof RetryableError && !permanent
          ? { retryAfter: duration(workError.retryAfterMs) }
          : {}),
      },
    });
  } catch (error) {
    if (error instanceof CoordinatorError && error.code === Code.Aborted) return leaseLost(error);
    // The work's error is what the caller needs; the lease runs out and the
    // key is retried as if the holder had died.
  }
  throw workError;
}

/** ExtendLease every `intervalMs`, sooner again after an error worth retrying. */
function startHeartbeat(
  intervalMs: number,
  extend: () => Promise<void>,
  markLost: (error: CoordinatorError) => void,
): { stop(): Promise<void> } {
  let stopped = false;
  let timer: NodeJS.Timeout | undefined;
  let inFlight: Promise<void> | undefined;
  let failures = 0;
  const schedule = (delayMs: number): void => {
    if (!stopped) timer = setTimeout(tick, delayMs);
  };
  const tick = (): void => {
    timer = undefined;
    inFlight = (async () => {
      try {
        await extend();
        failures = 0;
        schedule(intervalMs);
      } catch (thrown) {
        const error = CoordinatorError.from(thrown, "ExtendLease");
        if (error.code === Code.Aborted) {
          // LEASE_LOST or LEASE_EXPIRED: another caller may now run the work.
          markLost(error);
        } else if (isRetryable(error)) {
          schedule(Math.min(backoffDelay(failures++, error.retryAfterMs), intervalMs));
        } else {
          // Anything else (credentials revoked, say) is tried again on the
          // period; if it persists the lease runs out and the next
          // heartbeat hears ABORTED.
          schedule(intervalMs);
        }
      }
    })();
  };
  schedule(intervalMs);
  return {
    async stop() {
      stopped = true;
      if (timer !== undefined) clearTimeout(timer);
      await inFlight;
    },
  };
}

/** UNAVAILABLE, DEADLINE_EXCEEDED and RESOURCE_EXHAUSTED for SERVER_BUSY or TOO_MANY_WAITERS. */
export function isRetryable(error: CoordinatorError): boolean {
  switch (error.code) {
    case Code.Unavailable:
    case Code.DeadlineExceeded:
      return true;
    case Code.ResourceExhausted:
      return error.reason === "SERVER_BUSY" || error.reason === "TOO_MANY_WAITERS";
    default:
      return false;
  }
}

/** 100 ms doubling to 2 s, jittered to between half and all of it, never under the server's RetryInfo. */
function backoffDelay(retry: number, serverDelayMs: number | undefined): number {
  const ceiling = Math.min(BACKOFF_CAP_MS, BACKOFF_BASE_MS * 2 ** retry);
  const jittered = ceiling / 2 + (Math.random() * ceiling) / 2;
  return Math.max(jittered, serverDelayMs ?? 0);
}

async function withRetries<R>(
  rpc: string,
  maxRetries: number,
  signal: AbortSignal | undefined,
  call: () => Promise<R>,
): Promise<R> {
  for (let retry = 0; ; retry++) {
    try {
      return await call();
    } catch (thrown) {
      if (signal?.aborted) throw signal.reason;
      const error = CoordinatorError.from(thrown, rpc);
      if (retry >= maxRetries || !isRetryable(error)) throw error;
      try {
        await sleepFor(backoffDelay(retry, error.retryAfterMs), undefined, signal ? { signal } : {});
      } catch (sleepError) {
        throw signal?.aborted ? signal.reason : sleepError;
      }
    }
  }
}

function callOptions(timeoutMs: number, signal: AbortSignal | undefined) {
  return signal === undefined ? { timeoutMs } : { timeoutMs, signal };
}

function fingerprintOf(
  options: FingerprintOptions,
): NonNullable<MessageInitShape<typeof AcquireRequestSchema>["requestFingerprint"]> {
  if (options.payload !== undefined) return { case: "payload", value: options.payload };
  if (options.jsonPayload !== undefined) return { case: "jsonPayload", value: options.jsonPayload };
  if (options.fingerprint !== undefined) return { case: "fingerprint", value: options.fingerprint };
  return { case: undefined };
}

function describe(error: unknown): string {
  let text: string;
  if (error instanceof Error) {
    text = error.message === "" ? error.name : `${error.name}: ${error.message}`;
  } else {
    try {
      text = typeof error === "string" ? error : (JSON.stringify(error) ?? String(error));
    } catch {
      text = String(error);
    }
  }
  return text.length > MAX_ERROR_TEXT ? text.slice(0, MAX_ERROR_TEXT) : text;
}

function duration(ms: number): MessageInitShape<typeof DurationSchema> {
  const whole = Math.max(0, Math.round(ms));
  return { seconds: BigInt(Math.floor(whole / 1000)), nanos: (whole % 1000) * 1_000_000 };
}

function millis(value: Duration | undefined): number {
  if (value === undefined) return 0;
  return Number(value.seconds) * 1000 + Math.floor(value.nanos / 1_000_000);
}

function date(value: Timestamp | undefined): Date | undefined {
  if (value === undefined) return undefined;
  return new Date(Number(value.seconds) * 1000 + Math.floor(value.nanos / 1_000_000));
}
