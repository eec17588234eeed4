/** The one error base class: a stable `code` that tests and callers branch on, and the `cause` it wraps. */
export class SealionError extends Error {
  readonly code: string;

  constructor(code: string, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'SealionError';
    this.code = code;
  }
}
