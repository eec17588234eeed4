// Finished recordings sent to a receiver (a kubeconfig-format file names it, as the audit webhook's does), one at a
// time, each as its asciicast file with its audit ID in a header. The replica keeps its own copy meanwhile, within
// its budget, so a receiver that is down loses nothing the folder still holds.
import { readFile } from 'node:fs/promises';
import type { Logger } from '../../lib/log.ts';
import type { WebhookClient } from '../audit/sinks.ts';

/** Recordings waiting to be sent: far more than a replica finishes while a receiver restarts. */
export const MAX_WAITING_UPLOADS = 1000;

export interface RecordingUploader {
  /** Sends the finished recording `id` at `path` when its turn comes. */
  add(id: string, path: string): void;
  /** Stops: what waits is not sent (the files stay). */
  close(): Promise<void>;
}

export function newRecordingUploader(client: WebhookClient, log: Logger): RecordingUploader {
  const waiting: { id: string; path: string }[] = [];
  let sending = false;
  let closed = false;
  const next = async (): Promise<void> => {
    if (sending || closed) return;
    const upload = waiting.shift();
    if (!upload) return;
    sending = true;
    try {
      // One at a time: a recording is at most its size limit in memory while it is sent.
      const body = await readFile(upload.path);
      await client.send(body, { 'content-type': 'application/x-asciicast', 'x-sealion-audit-id': upload.id });
    } catch (err) {
      if (!closed) log.warn({ id: upload.id, err: (err as Error).message }, 'a recording could not be sent');
    } finally {
      sending = false;
      void next();
    }
  };
  return {
    add(id, path) {
      if (closed) return;
      if (waiting.length >= MAX_WAITING_UPLOADS) {
        log.warn({ id }, 'a recording was not sent: too many wait already');
        return;
      }
      waiting.push({ id, path });
      void next();
    },
    async close() {
      closed = true;
      waiting.length = 0;
      await client.close();
    },
  };
}
