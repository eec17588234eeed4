// The API server's channel protocols for exec and attach over WebSocket (`v5.channel.k8s.io` down to `channel.k8s.io`):
// each message's first byte names its channel. One table for the code that speaks them (the SSH door runs commands
// with them) and the code that reads them (the recorder).

/** The channels in the order of their numbers: a message's first byte is its channel's index here. */
export const EXEC_CHANNELS = ['stdin', 'stdout', 'stderr', 'error', 'resize'] as const;
export type ExecChannel = (typeof EXEC_CHANNELS)[number];

/** A channel's number, the first byte of its messages. */
export const CHANNEL: Readonly<Record<ExecChannel, number>> = {
  stdin: 0,
  stdout: 1,
  stderr: 2,
  error: 3,
  resize: 4,
};

/** v5's message that closes one channel (the channel's number follows): a client's stdin can end alone. */
export const CLOSE_CHANNEL = 255;

/** The newest protocol, the first that has CLOSE_CHANNEL. */
export const V5_PROTOCOL = 'v5.channel.k8s.io';
/** The one before it: the same channels, no close. */
export const V4_PROTOCOL = 'v4.channel.k8s.io';
