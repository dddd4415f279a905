// The README's examples, run as written against a real coordinator: the ES
// module example (TypeScript, transpiled as it stands) and the CommonJS one
// (plain JavaScript, run by node as a .cjs file, through the package's
// `require` build). Only the address changes, to the test server's, and the
// package name points at this build; what the examples call "yours" (the
// order, the payment provider, the answers) gets stand-ins.
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { promisify } from "node:util";
import { after, before, test } from "node:test";
import ts from "typescript";
import { createDatabase, freshKey, startServer, type TestDatabase, type TestServer } from "./harness.js";

const here = dirname(fileURLToPath(import.meta.url));
/** clients/node (this file runs from clients/node/dist/test). */
const packageRoot = resolve(here, "..", "..");
const readme = readFileSync(join(packageRoot, "README.md"), "utf8");
const PACKAGE = "@idempotency-coordinator/client";
const README_ADDRESS = "http://127.0.0.1:50051";

/** The README's fenced blocks in one language, in order. */
function blocks(language: string): string[] {
  return [...readme.matchAll(new RegExp("^```" + language + "\\n([\\s\\S]*?)^```$", "gm"))].map((m) => m[1] ?? "");
}

let db: TestDatabase;
let server: TestServer;
let dir: string;

before(async () => {
  db = createDatabase("node_readme");
  server = await startServer(db.url);
  dir = mkdtempSync(join(tmpdir(), "readme-"));
});

after(async () => {
  await server?.stop();
  db?.drop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

function adapt(code: string, entry: string): string {
  assert.ok(code.includes(PACKAGE), "the example imports the package by name");
  assert.ok(code.includes(README_ADDRESS), "the example names the README's address");
  return code.split(PACKAGE).join(entry).split(README_ADDRESS).join(server.baseUrl);
}

test("the README's ES module example runs, and a second run replays the stored value", async () => {
  const [example] = blocks("ts");
  assert.ok(example, "README has a ts example");
  const js = ts.transpileModule(example, {
    compilerOptions: { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2022 },
  }).outputText;
  const entry = pathToFileURL(join(packageRoot, "dist", "src", "index.js")).href;
  const key = freshKey("readme-order");
  const prelude = `
const order = { id: ${JSON.stringify(key)}, amount: 1999 };
const psp = { async charge(o, { signal }) { signal.throwIfAborted(); globalThis.readmeCharges.push(o.id); return { id: "ch-" + o.id, declined: false }; } };
const reply = (value) => globalThis.readmeOutcomes.push({ value });
const retryIn = (ms) => globalThis.readmeOutcomes.push({ retryIn: ms });
`;
  const g = globalThis as unknown as { readmeCharges: string[]; readmeOutcomes: unknown[] };
  g.readmeCharges = [];
  g.readmeOutcomes = [];
  // An import must come first in a module: the prelude goes after the example's imports.
  const adapted = adapt(js, entry);
  const lastImport = adapted.lastIndexOf("\nimport ");
  const cut = adapted.indexOf("\n", lastImport + 1) + 1;
  const source = adapted.slice(0, cut) + prelude + adapted.slice(cut);
  for (const run of [1, 2]) {
    const file = join(dir, `example-${run}.mjs`);
    writeFileSync(file, source);
    await import(pathToFileURL(file).href);
  }
  assert.deepEqual(g.readmeCharges, [key], "the card was charged once");
  assert.deepEqual(g.readmeOutcomes, [{ value: { chargeId: "ch-" + key } }, { value: { chargeId: "ch-" + key } }]);
});

test("the README's CommonJS example runs under require()", async () => {
  const [example] = blocks("js");
  assert.ok(example, "README has a CommonJS example");
  const file = join(dir, "example.cjs");
  writeFileSync(file, adapt(example, join(packageRoot, "dist", "cjs", "src", "index.js")));
  const { stdout } = await promisify(execFile)(process.execPath, [file], { timeout: 30_000 });
  assert.match(stdout, /^done sent$/m);
});
