// runOnceInTransaction: the work's writes and the record's SUCCEEDED
// committed together, in the caller's own PostgreSQL transaction
// (docs/in-transaction.md), on a `pg` client (or anything with its
// `query(text, values)`).
//
// Acquire goes to the coordinator as in runOnce. The work runs in a
// savepoint of the caller's transaction; on success
// idempotency_complete_in_tx runs in that savepoint, which is then
// released, and the caller commits. A failed work rolls the savepoint back
// and is reported with a Complete, as in runOnce.
import { Code, ConnectError } from "@connectrpc/connect";
import type { CoordinatorClient } from "./client.js";
import { CoordinatorError } from "./errors.js";
import { ErrorInfoSchema } from "./gen/google/rpc/error_details_pb.js";
import { Status } from "./gen/idempotency/v1/coordinator_pb.js";
import { runOnceWith, type InTransaction, type RunOnceOptions, type RunOnceOutcome, type Work } from "./run-once.js";

/** What the library needs of the caller's connection: `pg`'s `Client` and `PoolClient` have it. */
export interface SqlConnection {
  query(text: string, values?: unknown[]): Promise<{ rows: unknown[] }>;
}

export type InTransactionOptions<T> = RunOnceOptions<T> & {
  /**
   * The tenant the coordinator files this caller's records under: the one
   * its credentials name ("default", when authentication is off, unless set).
   */
  readonly tenant?: string;
  /** The schema the coordinator was installed into, when the session's search_path does not list it. */
  readonly schema?: string;
};

const SAVEPOINT = "idempotency_work";

/**
 * Runs `work` at most once for (scope, key), its result stored inside the
 * transaction open on `connection` (the caller has sent BEGIN): the work's
 * writes on `connection` and the record's SUCCEEDED commit or roll back
 * together. The caller commits after this returns; until then its
 * transaction holds the record's row lock, so no other caller can take
 * over. A holder whose lease was taken over gets a `lease_lost` outcome and
 * its writes roll back. Outcomes and errors are runOnce's.
 */
export async function runOnceInTransaction<T>(
  client: CoordinatorClient,
  connection: SqlConnection,
  options: InTransactionOptions<T>,
  work: Work<T>,
): Promise<RunOnceOutcome<T>> {
  const tenant = options.tenant ?? "default";
  const fn =
    options.schema === undefined
      ? "idempotency_complete_in_tx"
      : `"${options.schema.replaceAll('"', '""')}".idempotency_complete_in_tx`;
  const inTransaction: InTransaction = {
    async begin() {
      await connection.query(`SAVEPOINT ${SAVEPOINT}`);
    },
    async rollback() {
      await connection.query(`ROLLBACK TO SAVEPOINT ${SAVEPOINT}`);
      await connection.query(`RELEASE SAVEPOINT ${SAVEPOINT}`);
    },
    async complete(token, result, contentType, record) {
      await connection.query(
        `SELECT status FROM ${fn}($1::text, $2::text, $3::text, $4::text::uuid, $5::bytea, $6::text, 0, '')`,
        [tenant, options.scope, options.key, token, Buffer.from(result), contentType],
      );
      await connection.query(`RELEASE SAVEPOINT ${SAVEPOINT}`);
      record.status = Status.SUCCEEDED;
      record.result = { $typeName: "idempotency.v1.Success", result, contentType, statusCode: 0, resultRef: "" };
      record.leaseExpiresAt = undefined;
      return record;
    },
    refusal,
  };
  return runOnceWith(client, options, work, inTransaction);
}

/** The CoordinatorError a refused completion stands for, by its SQLSTATE. */
function refusal(error: unknown): CoordinatorError | undefined {
  const state = (error as { code?: unknown } | null)?.code;
  const message = error instanceof Error ? error.message : String(error);
  const as = (code: Code, reason: string) =>
    new CoordinatorError(
      new ConnectError(message, code, undefined, [
        { desc: ErrorInfoSchema, value: { reason, domain: "idempotency.v1" } },
      ]),
      "Complete",
    );
  switch (state) {
    case "IK002":
      return as(Code.Aborted, "LEASE_LOST");
    case "IK001":
      return as(Code.NotFound, "RECORD_NOT_FOUND");
    case "IK003":
      return as(Code.FailedPrecondition, "ALREADY_COMPLETED");
    case "22023":
      return as(Code.InvalidArgument, "RESULT_REFUSED");
    default:
      return undefined;
  }
}
