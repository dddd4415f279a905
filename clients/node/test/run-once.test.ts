// The acceptance tests every client library passes (clients/README.md),
// against a real coordinator on a database of its own.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { after, before, describe, test } from "node:test";
import { isMessage } from "@bufbuild/protobuf";
import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import {
  CoordinatorError,
  Decision,
  PermanentError,
  RetryableError,
  Status,
  createClient,
  runOnce,
  type CoordinatorClient,
  type LeaseContext,
} from "../src/index.js";
import { AcquireRequestSchema, AcquireResponseSchema } from "../src/gen/idempotency/v1/coordinator_pb.js";
import { createDatabase, freshKey, startServer, waitFor, type TestDatabase, type TestServer } from "./harness.js";

const SCOPE = "tests.node";
let db: TestDatabase;
let server: TestServer;
let client: CoordinatorClient;

before(async () => {
  db = createDatabase();
  // A short backoff base so that a failed attempt's retry comes due quickly.
  server = await startServer(db.url, ["--backoff-base", "500ms"]);
  client = createClient({ baseUrl: server.baseUrl });
});

after(async () => {
  client?.close();
  await server?.stop();
  db?.drop();
});

/** A promise with its resolve function, to hand a moment from one task to another. */
function deferred<T = void>(): { promise: Promise<T>; resolve: (value: T) => void } {
  let resolve!: (value: T) => void;
  const promise = new Promise<T>((r) => (resolve = r));
  return { promise, resolve };
}

/** Resolves when `signal` aborts; rejects after `timeoutMs` (the test then fails). */
function aborted(signal: AbortSignal, timeoutMs: number): Promise<unknown> {
  return new Promise((resolve, reject) => {
    if (signal.aborted) return resolve(signal.reason);
    const timer = setTimeout(() => reject(new Error(`signal did not abort within ${timeoutMs} ms`)), timeoutMs);
    signal.addEventListener("abort", () => {
      clearTimeout(timer);
      resolve(signal.reason);
    });
  });
}

async function record(key: string) {
  const found = await client.get(SCOPE, key);
  assert.ok(found, `a record for ${key}`);
  return found;
}

/** A bare Acquire (no template) polled until PROCEED, for taking over an expired lease. */
async function takeOver(key: string) {
  return waitFor(
    "the second caller to take over",
    async () => {
      const response = await client.stub.acquire(
        { scope: SCOPE, key, leaseTtl: { seconds: 30n }, requestId: randomUUID() },
        { timeoutMs: 5_000 },
      );
      return response.decision === Decision.PROCEED ? response : undefined;
    },
    10_000,
  );
}

describe("runOnce", () => {
  test("the first call runs the work and a second replays its result without running it", async () => {
    const key = freshKey("replay");
    let runs = 0;
    const first = await runOnce(client, { scope: SCOPE, key }, async (lease) => {
      runs++;
      assert.equal(lease.attempt, 1);
      assert.ok(lease.fencingToken > 0n);
      assert.equal(lease.checkpoint.length, 0);
      return { charged: 42, currency: "EUR" };
    });
    assert.equal(first.kind, "done");
    assert.ok(first.kind === "done");
    assert.deepEqual(first.value, { charged: 42, currency: "EUR" });
    assert.equal(first.replayed, false);
    assert.equal(first.record.status, Status.SUCCEEDED);

    const second = await runOnce(client, { scope: SCOPE, key }, async () => {
      runs++;
      return { charged: 0, currency: "EUR" };
    });
    assert.ok(second.kind === "done", `second outcome ${second.kind}`);
    assert.deepEqual(second.value, { charged: 42, currency: "EUR" });
    assert.equal(second.replayed, true);
    assert.equal(runs, 1);
    assert.equal((await record(key)).attemptCount, 1);
  });

  test("20 concurrent calls on one key run the work once and all return the same result", async () => {
    const key = freshKey("concurrent");
    let runs = 0;
    const outcomes = await Promise.all(
      Array.from({ length: 20 }, () =>
        runOnce(client, { scope: SCOPE, key, jsonPayload: '{"order": 7}' }, async () => {
          runs++;
          // Long enough that the other callers arrive while it runs.
          await new Promise((r) => setTimeout(r, 300));
          return { id: randomUUID() };
        }),
      ),
    );
    assert.equal(runs, 1);
    const values = outcomes.map((o) => {
      assert.ok(o.kind === "done", `outcome ${o.kind}`);
      return o.value.id;
    });
    assert.equal(new Set(values).size, 1);
    assert.equal(outcomes.filter((o) => o.kind === "done" && !o.replayed).length, 1);
    assert.equal((await record(key)).attemptCount, 1);
  });

  test("a work that takes longer than the lease TTL keeps its lease through heartbeats", async () => {
    const key = freshKey("heartbeat");
    const ttlMs = 1_000;
    const outcome = await runOnce(client, { scope: SCOPE, key, leaseTtlMs: ttlMs }, async (lease) => {
      const started = Date.now();
      const firstExpiry = lease.expiresAt?.getTime() ?? 0;
      // Run for three lease TTLs; all the while another caller is told the
      // key is in progress, never given it.
      while (Date.now() - started < 3 * ttlMs) {
        const other = await client.stub.acquire(
          { scope: SCOPE, key, requestId: randomUUID() },
          { timeoutMs: 5_000 },
        );
        assert.equal(other.decision, Decision.IN_PROGRESS, "another caller is kept out");
        assert.equal(lease.signal.aborted, false);
        await new Promise((r) => setTimeout(r, 100));
      }
      assert.ok((lease.expiresAt?.getTime() ?? 0) > firstExpiry + ttlMs, "the heartbeat pushed the expiry");
      return "finished";
    });
    assert.ok(outcome.kind === "done");
    assert.equal(outcome.value, "finished");
    const stored = await record(key);
    assert.equal(stored.status, Status.SUCCEEDED);
    assert.equal(stored.attemptCount, 1);
  });

  test("a work that raises leaves the key retryable, and the next holder sees its checkpoint", async () => {
    const key = freshKey("retryable");
    const boom = new Error("card network down");
    await assert.rejects(
      runOnce(client, { scope: SCOPE, key }, async (lease) => {
        await lease.saveCheckpoint(new TextEncoder().encode("step-1"));
        assert.equal(new TextDecoder().decode(lease.checkpoint), "step-1");
        throw boom;
      }),
      (error) => error === boom,
    );
    const failed = await record(key);
    assert.equal(failed.status, Status.FAILED);
    assert.match(failed.lastError, /card network down/);

    // Right after, the retry is not due yet.
    let runs = 0;
    const work = async (lease: LeaseContext) => {
      runs++;
      return { attempt: lease.attempt, checkpoint: new TextDecoder().decode(lease.checkpoint) };
    };
    const early = await runOnce(client, { scope: SCOPE, key }, work);
    assert.ok(early.kind === "retry_later", `outcome ${early.kind}`);
    assert.ok(early.retryAfterMs > 0);
    assert.equal(runs, 0);

    // Once it is due, a later call runs the work again as attempt 2.
    const done = await waitFor("the retry to come due", async () => {
      const outcome = await runOnce(client, { scope: SCOPE, key }, work);
      return outcome.kind === "retry_later" ? undefined : outcome;
    });
    assert.ok(done.kind === "done", `outcome ${done.kind}`);
    assert.deepEqual(done.value, { attempt: 2, checkpoint: "step-1" });
    assert.equal(runs, 1);
    assert.equal((await record(key)).attemptCount, 2);
  });

  test("a RetryableError sets when the retry comes due", async () => {
    const key = freshKey("retry-after");
    await assert.rejects(
      runOnce(client, { scope: SCOPE, key }, () => {
        throw new RetryableError("rate limited", { retryAfterMs: 20_000 });
      }),
      RetryableError,
    );
    const later = await runOnce(client, { scope: SCOPE, key }, () => "never");
    assert.ok(later.kind === "retry_later", `outcome ${later.kind}`);
    assert.ok(later.retryAfterMs > 15_000, `retry after ${later.retryAfterMs} ms`);
  });

  test("a permanent failure makes the key EXHAUSTED", async () => {
    const key = freshKey("permanent");
    await assert.rejects(
      runOnce(client, { scope: SCOPE, key }, () => {
        throw new PermanentError("card declined");
      }),
      PermanentError,
    );
    let runs = 0;
    const outcome = await runOnce(client, { scope: SCOPE, key }, () => {
      runs++;
    });
    assert.ok(outcome.kind === "exhausted", `outcome ${outcome.kind}`);
    assert.match(outcome.lastError, /card declined/);
    assert.equal(outcome.record.status, Status.FAILED_PERMANENT);
    assert.equal(runs, 0);

    // The classifier marks other errors permanent.
    const key2 = freshKey("classifier");
    class Declined extends Error {}
    await assert.rejects(
      runOnce(client, { scope: SCOPE, key: key2, isPermanent: (e) => e instanceof Declined }, () => {
        throw new Declined("no funds");
      }),
      Declined,
    );
    const second = await runOnce(client, { scope: SCOPE, key: key2 }, () => undefined);
    assert.equal(second.kind, "exhausted");
  });

  test("a key reused for a different request is a CONFLICT", async () => {
    const key = freshKey("conflict");
    const first = await runOnce(client, { scope: SCOPE, key, fingerprint: "order-1" }, () => 1);
    assert.equal(first.kind, "done");
    let runs = 0;
    const second = await runOnce(client, { scope: SCOPE, key, fingerprint: "order-2" }, () => ++runs);
    assert.ok(second.kind === "conflict", `outcome ${second.kind}`);
    assert.equal(second.record.fingerprint, "order-1");
    assert.equal(runs, 0);
  });

  test("a holder whose lease was taken over is told, and its late Complete is refused", async () => {
    const key = freshKey("takeover");
    const leaseSeen = deferred<LeaseContext>();
    // A's heartbeat period is longer than its TTL, so its lease lapses.
    const aRun = runOnce(
      client,
      { scope: SCOPE, key, leaseTtlMs: 1_000, heartbeatIntervalMs: 2_500 },
      async (lease) => {
        leaseSeen.resolve(lease);
        throw await aborted(lease.signal, 15_000);
      },
    );
    const aLease = await leaseSeen.promise;
    const b = await takeOver(key);
    assert.equal(b.lease?.attempt, 2);
    assert.ok((b.lease?.fencingToken ?? 0n) > aLease.fencingToken);

    const outcome = await aRun;
    assert.ok(outcome.kind === "lease_lost", `outcome ${outcome.kind}`);
    assert.equal(outcome.reason, "LEASE_LOST");
    assert.equal(outcome.error.code, Code.Aborted);
    assert.equal(outcome.attempt, 1);
    assert.ok(aLease.signal.aborted);
    assert.equal(outcome.workError, aLease.signal.reason);
    assert.ok(!("value" in outcome), "the work threw: it returned nothing");
    // The template did not Complete: B still holds the key.
    const held = await record(key);
    assert.equal(held.status, Status.PROCESSING);
    assert.equal(held.fencingToken, b.lease?.fencingToken);

    // A late Complete with A's token is refused.
    const late = await client.stub
      .complete({
        scope: SCOPE,
        key,
        leaseToken: aLease.token,
        outcome: { case: "success", value: { result: new Uint8Array([1]) } },
      })
      .then(
        () => assert.fail("a late Complete was accepted"),
        (error: unknown) => CoordinatorError.from(error),
      );
    assert.equal(late.code, Code.Aborted);
    assert.equal(late.reason, "LEASE_LOST");

    await client.stub.complete({
      scope: SCOPE,
      key,
      leaseToken: b.lease?.token ?? "",
      outcome: { case: "release", value: {} },
    });
  });

  test("with the heartbeat off, a holder that returns after a takeover gets LEASE_LOST", async () => {
    const key = freshKey("takeover-quiet");
    const leaseSeen = deferred<LeaseContext>();
    const takenOver = deferred();
    const aRun = runOnce(
      client,
      { scope: SCOPE, key, leaseTtlMs: 1_000, heartbeatIntervalMs: false },
      async (lease) => {
        leaseSeen.resolve(lease);
        await takenOver.promise;
        return "late result";
      },
    );
    await leaseSeen.promise;
    const b = await takeOver(key);
    takenOver.resolve();
    const outcome = await aRun;
    assert.ok(outcome.kind === "lease_lost", `outcome ${outcome.kind}`);
    assert.equal(outcome.reason, "LEASE_LOST");
    assert.equal(outcome.workError, undefined);
    // The work ran: what it returned comes back, not stored.
    assert.equal(outcome.value, "late result");
    const held = await record(key);
    assert.equal(held.status, Status.PROCESSING);
    assert.equal(held.fencingToken, b.lease?.fencingToken);
  });

  test("a lost Acquire reply is recovered by the same request_id without a second lease", async () => {
    const key = freshKey("lost-reply");
    const requestIds: string[] = [];
    let dropped: { token: string; attempt: number; fencingToken: bigint } | undefined;
    // Lets the first Acquire reach the server (which grants the lease), then
    // drops its response as a broken connection would.
    const dropFirstAcquireReply: Interceptor = (next) => async (req) => {
      const response = await next(req);
      if (!req.stream && !response.stream && req.method.name === "Acquire") {
        assert.ok(isMessage(req.message, AcquireRequestSchema));
        assert.ok(isMessage(response.message, AcquireResponseSchema));
        requestIds.push(req.message.requestId);
        if (dropped === undefined) {
          const lease = response.message.lease;
          assert.ok(lease, "the dropped reply granted a lease");
          dropped = { token: lease.token, attempt: lease.attempt, fencingToken: lease.fencingToken };
          throw new ConnectError("reply lost", Code.Unavailable);
        }
      }
      return response;
    };
    const lossy = createClient({ baseUrl: server.baseUrl, interceptors: [dropFirstAcquireReply] });
    try {
      let runs = 0;
      const outcome = await runOnce(lossy, { scope: SCOPE, key }, (lease) => {
        runs++;
        assert.deepEqual(
          { token: lease.token, attempt: lease.attempt, fencingToken: lease.fencingToken },
          dropped,
        );
        return "charged once";
      });
      assert.ok(outcome.kind === "done", `outcome ${outcome.kind}`);
      assert.equal(outcome.value, "charged once");
      assert.equal(runs, 1);
      assert.equal(requestIds.length, 2);
      assert.equal(requestIds[0], requestIds[1]);
      assert.equal(dropped?.attempt, 1);
      assert.equal((await record(key)).attemptCount, 1);
    } finally {
      lossy.close();
    }
  });

  test("a bad argument is a CoordinatorError naming the field", async () => {
    let runs = 0;
    const error = await runOnce(client, { scope: "bad scope", key: "k" }, () => ++runs).then(
      () => assert.fail("a bad scope was accepted"),
      (e: unknown) => e,
    );
    assert.ok(error instanceof CoordinatorError, String(error));
    assert.equal(error.code, Code.InvalidArgument);
    assert.equal(error.codeName, "INVALID_ARGUMENT");
    assert.equal(error.reason, "INVALID_ARGUMENT");
    assert.equal(error.domain, "idempotency.v1");
    assert.ok(
      error.fieldViolations.some((v) => v.field === "scope"),
      JSON.stringify(error.fieldViolations),
    );
    assert.equal(runs, 0);
  });

  test("the caller's signal cancels the wait for another holder", async () => {
    const key = freshKey("cancel");
    const held = await client.stub.acquire({ scope: SCOPE, key, leaseTtl: { seconds: 30n } });
    assert.equal(held.decision, Decision.PROCEED);
    const started = Date.now();
    await assert.rejects(
      runOnce(client, { scope: SCOPE, key, waitMs: 10_000, signal: AbortSignal.timeout(300) }, () => "never"),
      (error: unknown) => error instanceof Error && error.name === "TimeoutError",
    );
    assert.ok(Date.now() - started < 5_000, "the wait ended when the signal aborted");
    // Without a wait, the held key is IN_PROGRESS with the time left on its lease.
    const busy = await runOnce(client, { scope: SCOPE, key, waitMs: 0 }, () => "never");
    assert.ok(busy.kind === "in_progress", `outcome ${busy.kind}`);
    assert.ok(busy.retryAfterMs > 20_000);
  });
});
