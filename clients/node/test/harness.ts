// Starts a real coordinator on a database of its own, for the tests and the
// benchmark. Nothing here is mocked: the server binary and PostgreSQL are the
// ones the client talks to in production.
import { spawn, execFileSync, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
/** The repository root (this file runs from clients/node/dist/test). */
export const repoRoot = resolve(here, "..", "..", "..", "..");

export function serverBinary(): string {
  const bin =
    process.env["IDEMPOTENCY_COORDINATOR_BIN"] ??
    resolve(repoRoot, "target", "debug", "idempotency-coordinator");
  if (!existsSync(bin)) {
    throw new Error(`no server binary at ${bin}: build it (cargo build) or set IDEMPOTENCY_COORDINATOR_BIN`);
  }
  return bin;
}

const adminUrl = process.env["DATABASE_URL"] ?? "postgres://postgres@127.0.0.1:5432/postgres";

function psql(sql: string): void {
  execFileSync("psql", [adminUrl, "-v", "ON_ERROR_STOP=1", "-q", "-c", sql], { stdio: ["ignore", "ignore", "pipe"] });
}

/** A database created for one suite; `drop()` removes it. */
export interface TestDatabase {
  readonly url: string;
  drop(): void;
}

export function createDatabase(prefix = "node_client"): TestDatabase {
  const name = `${prefix}_${process.pid}_${randomBytes(4).toString("hex")}`;
  psql(`CREATE DATABASE ${name}`);
  const url = new URL(adminUrl);
  url.pathname = `/${name}`;
  return {
    url: url.toString(),
    drop: () => psql(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`),
  };
}

/** A running coordinator process. */
export interface TestServer {
  /** host:port it listens on. */
  readonly addr: string;
  /** http://host:port, or https:// when started with TLS. */
  readonly baseUrl: string;
  /** Every stderr line so far (JSON log lines). */
  readonly log: string[];
  stop(): Promise<void>;
}

export async function startServer(databaseUrl: string, extraArgs: string[] = [], tls = false): Promise<TestServer> {
  const args = [
    "--log-format",
    "json",
    "serve",
    "--listen",
    "127.0.0.1:0",
    "--database-url",
    databaseUrl,
    ...extraArgs,
  ];
  const child: ChildProcess = spawn(serverBinary(), args, { stdio: ["ignore", "ignore", "pipe"] });
  const log: string[] = [];
  let addr: string | undefined;
  const ready = new Promise<void>((resolveReady, rejectReady) => {
    const timer = setTimeout(() => rejectReady(new Error(`server not ready in 30 s:\n${log.join("\n")}`)), 30_000);
    child.once("exit", (code, sig) => {
      clearTimeout(timer);
      rejectReady(new Error(`server exited (${code ?? sig}) before it was ready:\n${log.join("\n")}`));
    });
    // Keep reading stderr for the life of the process so the pipe never fills.
    const lines = createInterface({ input: child.stderr! });
    lines.on("line", (line) => {
      log.push(line);
      let message: unknown;
      let fields: { [k: string]: unknown } | undefined;
      try {
        fields = (JSON.parse(line) as { fields?: { [k: string]: unknown } }).fields;
        message = fields?.["message"];
      } catch {
        return;
      }
      if (message === "listening" && typeof fields?.["addr"] === "string") addr = fields["addr"];
      if (message === "database ready") {
        clearTimeout(timer);
        resolveReady();
      }
    });
  });
  try {
    await ready;
  } catch (error) {
    child.kill("SIGKILL");
    throw error;
  }
  if (addr === undefined) {
    child.kill("SIGKILL");
    throw new Error(`server was ready but logged no address:\n${log.join("\n")}`);
  }
  const exited = new Promise<void>((r) => {
    if (child.exitCode !== null || child.signalCode !== null) r();
    else child.once("exit", () => r());
  });
  return {
    addr,
    baseUrl: `${tls ? "https" : "http"}://${addr}`,
    log,
    async stop() {
      child.kill("SIGKILL");
      await exited;
    },
  };
}

/** Polls `check` until it returns a value other than undefined, or fails after `timeoutMs`. */
export async function waitFor<T>(
  what: string,
  check: () => Promise<T | undefined> | T | undefined,
  timeoutMs = 10_000,
  everyMs = 25,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

/** A key no other test uses. */
export function freshKey(label: string): string {
  return `${label}-${randomBytes(6).toString("hex")}`;
}
