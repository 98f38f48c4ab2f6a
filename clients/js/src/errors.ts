// Typed errors. Every error the SDK hands to the app is a HeraldError with a numeric `code`: a
// protocol reply code (100–112, or an application code 1000–1999 from a proxy hook), a close code (4000–4999) or a ClientCode (< 1000). Subclasses let an
// app branch with `instanceof` and TypeScript narrow on them.

import { ClientCode, isTemporaryError } from './codes.js';

export class HeraldError extends Error {
  readonly code: number;
  constructor(code: number, message: string) {
    super(message);
    this.code = code;
    this.name = 'HeraldError';
    // Keep `instanceof` working when compiled to ES5-style classes by other toolchains.
    Object.setPrototypeOf(this, new.target.prototype);
  }
}

/** The server answered a command with `{"error": {code, message}}`. */
export class ReplyError extends HeraldError {
  constructor(code: number, message: string) {
    super(code, message);
    this.name = 'ReplyError';
  }
  /** Worth retrying later (100, 110, 111, 112). */
  get temporary(): boolean {
    return isTemporaryError(this.code);
  }
}

/** A command got no reply in time. Its effect on the server is unknown. */
export class TimeoutError extends HeraldError {
  constructor(message = 'timed out waiting for a reply') {
    super(ClientCode.Timeout, message);
    this.name = 'TimeoutError';
  }
}

/**
 * The connection closed while a command was in flight, or the client was disconnected when the call
 * was made. `closeCode` is the code the connection ended with, when there was one.
 */
export class ConnectionError extends HeraldError {
  readonly closeCode?: number;
  constructor(code: number, message: string, closeCode?: number) {
    super(code, message);
    this.name = 'ConnectionError';
    this.closeCode = closeCode;
  }
}

/** Misuse of the API (subscribing twice, bad channel name …). */
export class UsageError extends HeraldError {
  constructor(code: number, message: string) {
    super(code, message);
    this.name = 'UsageError';
  }
}
