/**
 * How the work's return value is stored as the record's result, and how a
 * stored result is turned back into a value on replay.
 */
export interface Codec<T> {
  /** The media type stored with the result, for example "application/json". */
  readonly contentType: string;
  encode(value: T): Uint8Array;
  /** `contentType` is the one stored with the result (may be empty). */
  decode(bytes: Uint8Array, contentType: string): T;
}

const encoder = new TextEncoder();
const decoder = new TextDecoder("utf-8", { fatal: true });

/**
 * The default codec: JSON text in UTF-8. `undefined` is stored as an empty
 * result and replayed as `undefined`.
 */
export function jsonCodec<T = unknown>(): Codec<T> {
  return {
    contentType: "application/json",
    encode(value: T): Uint8Array {
      const text = JSON.stringify(value);
      return text === undefined ? new Uint8Array(0) : encoder.encode(text);
    },
    decode(bytes: Uint8Array): T {
      if (bytes.length === 0) return undefined as T;
      return JSON.parse(decoder.decode(bytes)) as T;
    },
  };
}

/** Stores the work's bytes as they are ("application/octet-stream"). */
export function bytesCodec(contentType = "application/octet-stream"): Codec<Uint8Array> {
  return {
    contentType,
    encode: (value) => value,
    decode: (bytes) => bytes,
  };
}

/** Stores a string as UTF-8 text ("text/plain; charset=utf-8"). */
export function textCodec(contentType = "text/plain; charset=utf-8"): Codec<string> {
  return {
    contentType,
    encode: (value) => encoder.encode(value),
    decode: (bytes) => decoder.decode(bytes),
  };
}
