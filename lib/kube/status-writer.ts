/** Writes part of an object's status (a JSON merge patch of the status subresource: fields not named are kept). */
export interface StatusWriter<S> {
  patchStatus(name: string, status: Partial<S>, namespace?: string): Promise<void>;
}

/** A StatusWriter that records writes, for controller tests. */
export class RecordingStatusWriter<S> implements StatusWriter<S> {
  readonly writes: { name: string; status: Partial<S> }[] = [];
  failNext: Error | undefined;

  patchStatus(name: string, status: Partial<S>): Promise<void> {
    if (this.failNext) {
      const err = this.failNext;
      this.failNext = undefined;
      return Promise.reject(err);
    }
    this.writes.push({ name, status });
    return Promise.resolve();
  }
}
