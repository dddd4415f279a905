// Benchmark (not a test): what runOnce costs over the bare generated stub.
// Median over CYCLES cycles of
//   (a) runOnce on a fresh key: Acquire PROCEED + Complete, heartbeat on;
//   (b) the generated stub's Acquire + Complete with the same fields;
// alternated in ROUNDS rounds against one server on a database of its own.
//
//   npm run build && node dist/bench/bench.js [cycles] [rounds]
import { randomUUID } from "node:crypto";
import { performance } from "node:perf_hooks";
import { createClient, runOnce } from "../src/index.js";
import { createDatabase, startServer } from "../test/harness.js";

const cycles = Number(process.argv[2] ?? 1000);
const rounds = Number(process.argv[3] ?? 5);
const perRound = Math.ceil(cycles / rounds);
const scope = "bench.node";
const encoder = new TextEncoder();

function median(values: number[]): number {
  const sorted = [...values].sort((x, y) => x - y);
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2;
}

const db = createDatabase("node_client_bench");
const server = await startServer(db.url);
const client = createClient({ baseUrl: server.baseUrl });
const template: number[] = [];
const bare: number[] = [];
let serial = 0;

async function templateCycle(): Promise<number> {
  const key = `t-${process.pid}-${serial++}`;
  const start = performance.now();
  const outcome = await runOnce(client, { scope, key }, () => ({ ok: true, n: serial }));
  const elapsed = performance.now() - start;
  if (outcome.kind !== "done" || outcome.replayed) throw new Error(`unexpected outcome ${outcome.kind}`);
  return elapsed;
}

async function bareCycle(): Promise<number> {
  const key = `b-${process.pid}-${serial++}`;
  const start = performance.now();
  const acquired = await client.stub.acquire(
    { scope, key, leaseTtl: { seconds: 60n }, wait: { seconds: 10n }, requestId: randomUUID() },
    { timeoutMs: 20_000 },
  );
  await client.stub.complete(
    {
      scope,
      key,
      leaseToken: acquired.lease?.token ?? "",
      outcome: {
        case: "success",
        value: { result: encoder.encode(JSON.stringify({ ok: true, n: serial })), contentType: "application/json" },
      },
    },
    { timeoutMs: 10_000 },
  );
  return performance.now() - start;
}

try {
  // Warm the connection, the server's pool and the JIT.
  for (let i = 0; i < 50; i++) {
    await templateCycle();
    await bareCycle();
  }
  for (let round = 0; round < rounds; round++) {
    const first = round % 2 === 0;
    for (const kind of first ? ["template", "bare"] : ["bare", "template"]) {
      for (let i = 0; i < perRound; i++) {
        if (kind === "template") template.push(await templateCycle());
        else bare.push(await bareCycle());
      }
    }
  }
  const a = median(template);
  const b = median(bare);
  console.log(`cycles: ${template.length} each, in ${rounds} alternating rounds`);
  console.log(`runOnce (Acquire + Complete, heartbeat on): median ${a.toFixed(3)} ms`);
  console.log(`bare stub (Acquire + Complete):             median ${b.toFixed(3)} ms`);
  console.log(`overhead per cycle: ${(a - b).toFixed(3)} ms (${(((a - b) / b) * 100).toFixed(1)}%)`);
} finally {
  client.close();
  await server.stop();
  db.drop();
}
