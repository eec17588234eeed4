import { jest } from '@jest/globals';

// Real servers: starting one takes seconds, deleting a namespace many. A hang guard, not a timing assertion.
jest.setTimeout(120_000);
