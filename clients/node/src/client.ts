import type { SecureClientSessionOptions } from "node:http2";
import {
  Code,
  ConnectError,
  createClient as createConnectClient,
  type Client,
  type Interceptor,
  type Transport,
} from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import { CoordinatorError } from "./errors.js";
import { Coordinator, type Record as CoordinatorRecord } from "./gen/idempotency/v1/coordinator_pb.js";
import { runOnce, type RunOnceOptions, type RunOnceOutcome, type Work } from "./run-once.js";

/** The default deadline of one call (Acquire's is its wait window plus this). */
export const DEFAULT_CALL_TIMEOUT_MS = 10_000;

/** TLS for an `https://` base URL. PEM text or buffers, as node:tls takes them. */
export interface TlsOptions {
  /** CA certificate(s) to trust instead of the system's. */
  readonly ca?: string | Buffer | ReadonlyArray<string | Buffer>;
  /** Client certificate, for mutual TLS (with `key`). */
  readonly cert?: string | Buffer;
  /** Client private key, for mutual TLS (with `cert`). */
  readonly key?: string | Buffer;
  /** The name to verify the server's certificate against, when not the URL's host. */
  readonly serverName?: string;
}

interface CommonClientOptions {
  /** Sent as `authorization: Bearer <token>` on every call. */
  readonly bearerToken?: string;
  /** Deadline of each call in milliseconds (10 000 unless set). */
  readonly callTimeoutMs?: number;
}

export type ClientOptions = CommonClientOptions &
  (
    | {
        /** "http://host:port" (h2c) or "https://host:port" (TLS). */
        readonly baseUrl: string;
        readonly tls?: TlsOptions;
        /** Extra Connect interceptors, run outside the client's own. */
        readonly interceptors?: readonly Interceptor[];
        readonly transport?: undefined;
      }
    | {
        /**
         * A transport of your own (for example with your interceptors): gRPC to the
         * server's gRPC port, or the Connect protocol (`createConnectTransport`) to its
         * HTTP port (`--http-listen`).
         */
        readonly transport: Transport;
        readonly baseUrl?: undefined;
        readonly tls?: undefined;
        readonly interceptors?: undefined;
      }
  );

/** A connection to the coordinator. Make one per process and share it. */
export interface CoordinatorClient {
  /**
   * The generated Connect client, for the RPCs the library does not wrap
   * (Watch, WatchDue, Sweep). It throws `ConnectError`; pass it to
   * `CoordinatorError.from` for the decoded details. Carries the bearer token.
   */
  readonly stub: Client<typeof Coordinator>;
  /** The deadline of each call, in milliseconds. */
  readonly callTimeoutMs: number;
  /** `runOnce(client, options, work)` as a method. */
  runOnce<T>(options: RunOnceOptions<T>, work: Work<T>): Promise<RunOnceOutcome<T>>;
  /** The record of (scope, key), or undefined when there is none (NOT_FOUND). */
  get(scope: string, key: string, options?: { signal?: AbortSignal }): Promise<CoordinatorRecord | undefined>;
  /** Closes the connection (only one this client opened); calls in flight fail. */
  close(): void;
}

/** Connects to the coordinator. No connection is made until the first call. */
export function createClient(options: ClientOptions): CoordinatorClient {
  const callTimeoutMs = options.callTimeoutMs ?? DEFAULT_CALL_TIMEOUT_MS;
  if (!(callTimeoutMs > 0)) throw new RangeError("callTimeoutMs must be positive");
  let transport: Transport;
  let sessionManager: Http2SessionManager | undefined;
  if (options.transport !== undefined) {
    transport =
      options.bearerToken === undefined
        ? options.transport
        : withHeader(options.transport, "authorization", `Bearer ${options.bearerToken}`);
  } else {
    const url = new URL(options.baseUrl);
    const tls = options.tls;
    if (tls !== undefined && url.protocol !== "https:") {
      throw new TypeError("tls options need an https:// baseUrl");
    }
    const nodeOptions: SecureClientSessionOptions = {};
    if (tls?.ca !== undefined) nodeOptions.ca = tls.ca as string | Buffer | Array<string | Buffer>;
    if (tls?.cert !== undefined) nodeOptions.cert = tls.cert;
    if (tls?.key !== undefined) nodeOptions.key = tls.key;
    if (tls?.serverName !== undefined) nodeOptions.servername = tls.serverName;
    sessionManager = new Http2SessionManager(url, {}, nodeOptions);
    const interceptors: Interceptor[] = [...(options.interceptors ?? [])];
    if (options.bearerToken !== undefined) interceptors.push(bearer(options.bearerToken));
    transport = createGrpcTransport({
      baseUrl: options.baseUrl,
      sessionManager,
      interceptors,
    });
  }
  const stub = createConnectClient(Coordinator, transport);
  const client: CoordinatorClient = {
    stub,
    callTimeoutMs,
    runOnce: (runOptions, work) => runOnce(client, runOptions, work),
    async get(scope, key, getOptions) {
      try {
        const response = await stub.get(
          { scope, key },
          { timeoutMs: callTimeoutMs, ...(getOptions?.signal ? { signal: getOptions.signal } : {}) },
        );
        return response.record;
      } catch (error) {
        const wrapped = CoordinatorError.from(error, "Get");
        if (wrapped.code === Code.NotFound) return undefined;
        throw wrapped;
      }
    },
    close() {
      sessionManager?.abort(new ConnectError("client closed", Code.Canceled));
    },
  };
  return client;
}

/** Sends `authorization: Bearer <token>` with every call. */
function bearer(token: string): Interceptor {
  const value = `Bearer ${token}`;
  return (next) => (req) => {
    req.header.set("authorization", value);
    return next(req);
  };
}

function withHeader(inner: Transport, name: string, value: string): Transport {
  const add = (header: ConstructorParameters<typeof Headers>[0]): Headers => {
    const headers = new Headers(header);
    headers.set(name, value);
    return headers;
  };
  return {
    unary: (method, signal, timeoutMs, header, input, contextValues) =>
      inner.unary(method, signal, timeoutMs, add(header), input, contextValues),
    stream: (method, signal, timeoutMs, header, input, contextValues) =>
      inner.stream(method, signal, timeoutMs, add(header), input, contextValues),
  };
}
