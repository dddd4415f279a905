// Bearer tokens and TLS (server-authenticated and mutual) against real
// servers started with --auth-tokens and --tls-cert/--tls-key/--tls-client-ca.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { Code } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { CoordinatorError, createClient, runOnce } from "../src/index.js";
import { createDatabase, freshKey, startServer, type TestDatabase, type TestServer } from "./harness.js";

const SCOPE = "tests.node.security";
let db: TestDatabase;
let dir: string;

before(() => {
  db = createDatabase("node_client_sec");
  dir = mkdtempSync(join(tmpdir(), "idem-node-"));
});

after(() => {
  db?.drop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

async function failure(promise: Promise<unknown>): Promise<CoordinatorError> {
  return promise.then(
    () => assert.fail("the call was accepted"),
    (error: unknown) => {
      assert.ok(error instanceof CoordinatorError, String(error));
      return error;
    },
  );
}

describe("bearer tokens", () => {
  let server: TestServer;
  before(async () => {
    const tokens = join(dir, "tokens");
    writeFileSync(tokens, "node-test-token-0123456789 tenant-a\n");
    server = await startServer(db.url, ["--auth-tokens", tokens]);
  });
  after(async () => {
    await server?.stop();
  });

  test("a client with the right token runs the work", async () => {
    const client = createClient({ baseUrl: server.baseUrl, bearerToken: "node-test-token-0123456789" });
    try {
      const outcome = await runOnce(client, { scope: SCOPE, key: freshKey("auth") }, () => "ok");
      assert.ok(outcome.kind === "done" && outcome.value === "ok");
    } finally {
      client.close();
    }
  });

  test("a transport of the caller's own carries the token too (method form)", async () => {
    const client = createClient({
      transport: createGrpcTransport({ baseUrl: server.baseUrl }),
      bearerToken: "node-test-token-0123456789",
    });
    const outcome = await client.runOnce({ scope: SCOPE, key: freshKey("own-transport") }, () => 7);
    assert.ok(outcome.kind === "done" && outcome.value === 7);
  });

  for (const [label, token] of [
    ["without a token", undefined],
    ["with an unknown token", "wrong-token-0123456789"],
  ] as const) {
    test(`a client ${label} gets UNAUTHENTICATED`, async () => {
      const client = createClient(
        token === undefined ? { baseUrl: server.baseUrl } : { baseUrl: server.baseUrl, bearerToken: token },
      );
      try {
        let runs = 0;
        const error = await failure(runOnce(client, { scope: SCOPE, key: freshKey("noauth") }, () => ++runs));
        assert.equal(error.code, Code.Unauthenticated);
        assert.equal(error.codeName, "UNAUTHENTICATED");
        assert.equal(error.reason, "UNAUTHENTICATED");
        assert.equal(runs, 0);
      } finally {
        client.close();
      }
    });
  }
});

describe("TLS", () => {
  let server: TestServer;
  const pem = (name: string) => readFileSync(join(dir, name));

  before(async () => {
    const openssl = (...args: string[]) => execFileSync("openssl", args, { cwd: dir, stdio: "pipe" });
    const ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    openssl("req", "-x509", ...ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=test CA");
    const leaf = (name: string, ext: string) => {
      openssl("req", ...ec, "-keyout", `${name}.key`, "-out", `${name}.csr`, "-subj", `/CN=${name}`);
      writeFileSync(join(dir, `${name}.ext`), ext);
      openssl(
        "x509", "-req", "-in", `${name}.csr`, "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", `${name}.pem`, "-days", "2", "-extfile", `${name}.ext`,
      );
    };
    leaf("server", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n");
    leaf("client", "extendedKeyUsage=clientAuth\n");
    server = await startServer(
      db.url,
      ["--tls-cert", join(dir, "server.pem"), "--tls-key", join(dir, "server.key"), "--tls-client-ca", join(dir, "ca.pem")],
      true,
    );
  });
  after(async () => {
    await server?.stop();
  });

  test("a client with the CA and a client certificate runs the work over mutual TLS", async () => {
    const client = createClient({
      baseUrl: server.baseUrl,
      tls: { ca: pem("ca.pem"), cert: pem("client.pem"), key: pem("client.key") },
    });
    try {
      const outcome = await runOnce(client, { scope: SCOPE, key: freshKey("tls") }, () => "secure");
      assert.ok(outcome.kind === "done" && outcome.value === "secure");
    } finally {
      client.close();
    }
  });

  test("a client that does not trust the server's CA is refused before any call", async () => {
    const client = createClient({ baseUrl: server.baseUrl, callTimeoutMs: 3_000 });
    try {
      const error = await failure(runOnce(client, { scope: SCOPE, key: freshKey("untrusted"), maxRetries: 0 }, () => 1));
      // Node's TLS failure surfaces as INTERNAL (not retried).
      assert.equal(error.code, Code.Internal);
      assert.match(error.message, /certificate/i);
    } finally {
      client.close();
    }
  });

  test("a client without a client certificate is refused by mutual TLS", async () => {
    const client = createClient({ baseUrl: server.baseUrl, callTimeoutMs: 3_000, tls: { ca: pem("ca.pem") } });
    try {
      const error = await failure(runOnce(client, { scope: SCOPE, key: freshKey("nocert"), maxRetries: 0 }, () => 1));
      // The TLS alert surfaces as INTERNAL (not retried).
      assert.equal(error.code, Code.Internal);
      assert.match(error.message, /certificate required/i);
    } finally {
      client.close();
    }
  });
});
