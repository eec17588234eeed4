// What an SSH session does inside the clusters, as the user it signed in as: run a command in a container (an exec
// through the proxy's pipeline, so the target cluster decides, and audit and recording apply), and list what there
// is to enter. The SSH door's shell, commands, menu and sftp all work through this one interface.
import type { Readable, Writable } from 'node:stream';

/** A container, as the user names it: `<cluster>/<namespace>/<pod>/<container>`. */
export interface ContainerRef {
  cluster: string;
  namespace: string;
  pod: string;
  /** Empty: the pod's default container, as kubectl exec picks it. */
  container: string;
}

/** A terminal's size and type, for a command run with a PTY. */
export interface Terminal {
  cols: number;
  rows: number;
  term: string;
}

/** A command running in a container. */
export interface Running {
  /** Its standard input; ending it closes the command's stdin. */
  stdin: Writable;
  stdout: Readable;
  /** Empty when the command runs with a terminal (its errors come on stdout). */
  stderr: Readable;
  /**
   * Its exit status once it ends. Rejects with an Error whose message the user may read (a Kubernetes Status's
   * message: forbidden, not found, ...) when it could not run at all.
   */
  exit: Promise<number>;
  /** Tells the terminal its new size (commands run with a terminal only). */
  resize(size: { cols: number; rows: number }): void;
  /** Ends the exec stream, and with it the command. */
  kill(): void;
}

export interface Containers {
  /** Runs `argv` in the container, with a terminal when `tty` is given. */
  run(ref: ContainerRef, argv: readonly string[], tty?: Terminal): Running;
  /** The clusters the user may try, the hub's name first. */
  clusters(): Promise<string[]>;
  /** The namespaces of `cluster` the user may list pods in, as that cluster's RBAC says. */
  namespaces(cluster: string): Promise<string[]>;
  /** The running pods of a namespace the user may exec into. */
  pods(cluster: string, namespace: string): Promise<string[]>;
  /** A pod's containers, the default one first. */
  containers(cluster: string, namespace: string, pod: string): Promise<string[]>;
}
