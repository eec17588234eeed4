import { afterEach, jest } from '@jest/globals';
import { processErrorsMessage, takeProcessErrors } from './process-errors.ts';

// Real servers: starting one takes seconds, deleting a namespace many. A hang guard, not a timing assertion.
jest.setTimeout(120_000);

// A concierge process of this file reported an error nothing handled (process-errors.ts): the test it came in fails,
// naming it. One reported after the file's last test fails the file (environment.ts).
afterEach(() => {
  const errors = takeProcessErrors();
  if (errors.length > 0) throw new Error(processErrorsMessage(errors));
});
