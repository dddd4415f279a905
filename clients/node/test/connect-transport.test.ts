// The client over Connect-ES's own Connect transport (the coordinator's HTTP
// port, --http-listen) instead of gRPC: the unary calls runOnce makes, and
// Watch streaming in the Connect protocol, in protobuf and in JSON, over
// HTTP/1.1 and HTTP/2 (prior knowledge), against a real server requiring a bearer token. (The deadline's
// effect on a Watch is tested without a client's own timer, in tests/api.)
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { Code } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { CoordinatorError, createClient, runOnce, type CoordinatorClient } from "../src/index.js";
import { Status } from "../src/gen/idempotency/v1/coordinator_pb.js";
import { createDatabase, freshKey, startServer, type TestDatabase, type TestServer } from "./harness.js";

const SCOPE = "tests.node.connect";
const TOKEN = "node-connect-token-0123456789";
let db: TestDatabase;
let dir: string;
let server: TestServer;
let httpBase: string;

/** The HTTP port's address, from the server's log. */
function httpAddress(log: readonly string[]): string {
  for (const line of log) {
    try {
      const fields = (JSON.parse(line) as { fields?: { message?: string; addr?: string } }).fields;
      if (fields?.message === "serving HTTP/JSON" && fields.addr !== undefined) return fields.addr;
    } catch {
      // not a JSON line
    }
  }
  throw new Error(`the server logged no HTTP address:\n${log.join("\n")}`);
}

before(async () => {
  db = createDatabase("node_client_connect");
  dir = mkdtempSync(join(tmpdir(), "idem-node-connect-"));
  const tokens = join(dir, "tokens");
  writeFileSync(tokens, `${TOKEN} tenant-a\n`);
  server = await startServer(db.url, ["--auth-tokens", tokens, "--http-listen", "127.0.0.1:0"]);
  httpBase = `http://${httpAddress(server.log)}`;
});

after(async () => {
  await server?.stop();
  db?.drop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

for (const [format, binary, httpVersion] of [
  ["protobuf, HTTP/1.1", true, "1.1"],
  ["JSON, HTTP/1.1", false, "1.1"],
  ["protobuf, HTTP/2", true, "2"],
] as const) {
  const connectClient = (useBinaryFormat: boolean): CoordinatorClient => {
    const transport = createConnectTransport({ baseUrl: httpBase, httpVersion, useBinaryFormat });
    return createClient({ transport, bearerToken: TOKEN });
  };
  describe(`over the Connect transport (${format})`, () => {
    test("runOnce runs the work once", async () => {
      const client = connectClient(binary);
      const key = freshKey("run");
      let runs = 0;
      const first = await runOnce(client, { scope: SCOPE, key }, () => {
        runs += 1;
        return "sent";
      });
      assert.ok(first.kind === "done" && first.value === "sent", first.kind);
      const again = await runOnce(client, { scope: SCOPE, key }, () => {
        runs += 1;
        return "sent twice";
      });
      assert.ok(again.kind === "done" && again.replayed, again.kind);
      assert.equal(runs, 1);
    });

    test("Watch streams the record until it completes", async () => {
      const client = connectClient(binary);
      const key = freshKey("watch");
      const acquired = await client.stub.acquire({ scope: SCOPE, key });
      const token = acquired.lease?.token;
      assert.ok(token);
      const statuses: Status[] = [];
      for await (const event of client.stub.watch({ scope: SCOPE, key, timeout: { seconds: 20n } })) {
        statuses.push(event.record?.status ?? Status.UNSPECIFIED);
        assert.equal(event.timedOut, false);
        if (statuses.length === 1) {
          await client.stub.complete({
            scope: SCOPE,
            key,
            leaseToken: token,
            outcome: { case: "success", value: { result: new TextEncoder().encode("ok") } },
          });
        }
      }
      assert.deepEqual(statuses, [Status.PROCESSING, Status.SUCCEEDED]);
    });

    test("a Watch that cannot start fails with the coordinator's error", async () => {
      const client = connectClient(binary);
      const watching = (async () => {
        for await (const _ of client.stub.watch({ scope: SCOPE, key: freshKey("nobody") })) {
          assert.fail("no record, no event");
        }
      })();
      const error = await watching.then(
        () => assert.fail("the Watch ended cleanly"),
        (e: unknown) => CoordinatorError.from(e, "Watch"),
      );
      assert.equal(error.code, Code.NotFound);
      assert.equal(error.reason, "RECORD_NOT_FOUND");
    });
  });
}

test("without the token, the Connect transport's Watch is unauthenticated", async () => {
  const transport = createConnectTransport({ baseUrl: httpBase, httpVersion: "1.1" });
  const client = createClient({ transport });
  const watching = (async () => {
    for await (const _ of client.stub.watch({ scope: SCOPE, key: "k" })) {
      assert.fail("no event without credentials");
    }
  })();
  const error = await watching.then(
    () => assert.fail("the Watch ended cleanly"),
    (e: unknown) => CoordinatorError.from(e, "Watch"),
  );
  assert.equal(error.code, Code.Unauthenticated);
});
