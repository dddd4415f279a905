// runOnceInTransaction with `pg`: the work's row and the record's SUCCEEDED
// committed together, against a real coordinator, with an application
// table in the coordinator's own database.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { after, before, describe, test } from "node:test";
import pg from "pg";
import * as api from "../src/index.js";
import { Decision, Status, createClient, runOnce, runOnceInTransaction, type CoordinatorClient } from "../src/index.js";
import { createDatabase, freshKey, startServer, waitFor, type TestDatabase, type TestServer } from "./harness.js";

const SCOPE = "tests.node.tx";
let db: TestDatabase;
let server: TestServer;
let client: CoordinatorClient;

before(async () => {
  db = createDatabase("node_client_tx");
  server = await startServer(db.url);
  client = createClient({ baseUrl: server.baseUrl });
  await withConnection((c) => c.query("CREATE TABLE orders (order_key text NOT NULL, placed_by text NOT NULL)"));
});

after(async () => {
  client?.close();
  await server?.stop();
  db?.drop();
});

async function withConnection<R>(use: (c: pg.Client) => Promise<R>): Promise<R> {
  const c = new pg.Client({ connectionString: db.url });
  await c.connect();
  try {
    return await use(c);
  } finally {
    await c.end();
  }
}

async function placed(key: string): Promise<string[]> {
  return withConnection(async (c) => {
    const { rows } = await c.query<{ placed_by: string }>("SELECT placed_by FROM orders WHERE order_key = $1", [key]);
    return rows.map((r) => r.placed_by);
  });
}

describe("runOnceInTransaction", () => {
  test("50 concurrent callers insert one row and all get its result", async () => {
    const key = freshKey("tx");
    const outcomes = await Promise.all(
      Array.from({ length: 50 }, (_, i) =>
        withConnection(async (c) => {
          await c.query("BEGIN");
          const outcome = await runOnceInTransaction(
            client,
            c,
            { scope: SCOPE, key, waitMs: 30_000 },
            async () => {
              await c.query("INSERT INTO orders VALUES ($1, $2)", [key, `caller-${i}`]);
              return `order placed by caller-${i}`;
            },
          );
          await c.query("COMMIT");
          return outcome;
        }),
      ),
    );
    const rows = await placed(key);
    assert.equal(rows.length, 1, `rows ${rows.join(", ")}`);
    let ran = 0;
    for (const outcome of outcomes) {
      assert.ok(outcome.kind === "done", `outcome ${outcome.kind}`);
      if (!outcome.replayed) ran++;
      assert.equal(outcome.value, `order placed by ${rows[0]}`);
    }
    assert.equal(ran, 1);
    const record = await client.get(SCOPE, key);
    assert.equal(record?.status, Status.SUCCEEDED);
  });

  test("a holder whose lease was taken over cannot commit its row", async () => {
    const key = freshKey("tx-zombie");
    let inserted!: () => void;
    const insertedP = new Promise<void>((r) => (inserted = r));
    let resume!: () => void;
    const resumed = new Promise<void>((r) => (resume = r));
    const a = withConnection(async (c) => {
      await c.query("BEGIN");
      const outcome = await runOnceInTransaction(
        client,
        c,
        { scope: SCOPE, key, leaseTtlMs: 1_000, heartbeatIntervalMs: false },
        async () => {
          await c.query("INSERT INTO orders VALUES ($1, 'A')", [key]);
          inserted();
          await resumed;
          return "from A";
        },
      );
      await c.query("COMMIT");
      return outcome;
    });
    await insertedP;
    const b = await waitFor(
      "B to take over",
      async () => {
        const response = await client.stub.acquire(
          { scope: SCOPE, key, leaseTtl: { seconds: 30n }, requestId: randomUUID() },
          { timeoutMs: 5_000 },
        );
        return response.decision === Decision.PROCEED ? response : undefined;
      },
      10_000,
    );
    await client.stub.complete({
      scope: SCOPE,
      key,
      leaseToken: b.lease?.token ?? "",
      outcome: { case: "success", value: { result: new TextEncoder().encode('"from B"'), contentType: "application/json" } },
    });
    resume();
    const outcome = await a;
    assert.ok(outcome.kind === "lease_lost", `outcome ${outcome.kind}`);
    assert.equal(outcome.reason, "LEASE_LOST");
    assert.deepEqual(await placed(key), []);
    const record = await client.get(SCOPE, key);
    assert.equal(new TextDecoder().decode(record?.result?.result), '"from B"');
  });
  test("a database error before the work gives the lease back without counting an attempt", async () => {
    const key = freshKey("tx");
    let ran = false;
    await withConnection(async (c) => {
      // No BEGIN: the savepoint is refused before the work starts.
      await assert.rejects(
        runOnceInTransaction(client, c, { scope: SCOPE, key }, async () => {
          ran = true;
          return "never";
        }),
        /SAVEPOINT/,
      );
    });
    assert.equal(ran, false);
    const record = await client.get(SCOPE, key);
    assert.equal(record?.status, Status.FAILED);
    assert.equal(record?.attemptCount, 0);
    assert.equal(record?.lastError, "");
  });

  test("a result over the limit fails the key for good and leaves no row", async () => {
    const key = freshKey("tx");
    await withConnection(async (c) => {
      await c.query("BEGIN");
      await assert.rejects(
        runOnceInTransaction(client, c, { scope: SCOPE, key }, async () => {
          await c.query("INSERT INTO orders VALUES ($1, 'too big')", [key]);
          return "x".repeat(1024 * 1024 + 1);
        }),
        (error: unknown) => (error as { reason?: string }).reason === "RESULT_REFUSED",
      );
      await c.query("COMMIT");
    });
    assert.deepEqual(await placed(key), []);
    const record = await client.get(SCOPE, key);
    assert.equal(record?.status, Status.FAILED_PERMANENT);
    assert.equal(record?.attemptCount, 1);
  });

  test("a wrong tenant is named and the lease given back", async () => {
    const key = freshKey("tx");
    await withConnection(async (c) => {
      await c.query("BEGIN");
      await assert.rejects(
        runOnceInTransaction(client, c, { scope: SCOPE, key, tenant: "someone-else" }, async () => {
          await c.query("INSERT INTO orders VALUES ($1, 'wrong tenant')", [key]);
          return "placed";
        }),
        (error: unknown) =>
          (error as { reason?: string }).reason === "RECORD_NOT_FOUND" &&
          String((error as Error).message).includes('"someone-else"'),
      );
      await c.query("COMMIT");
    });
    assert.deepEqual(await placed(key), []);
    const record = await client.get(SCOPE, key);
    assert.equal(record?.status, Status.FAILED);
    assert.equal(record?.attemptCount, 0);
  });
  test("the in-transaction hook is not part of runOnce's public signature", () => {
    assert.equal(runOnce.length, 3);
    assert.equal("runOnceWith" in api, false);
  });
});
