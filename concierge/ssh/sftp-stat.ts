// What a file looks like to an SFTP client, read from `stat -c` in a container: its attributes, and the `ls -l`
// line (SFTP's "longname") that OpenSSH's `ls -l` prints as the server gives it.
import type { Attributes } from 'ssh2';

/**
 * The fields asked of `stat -c`: raw mode in hex, size, uid, gid, atime and mtime in seconds since the epoch, links,
 * user and group names. These are the ones GNU coreutils' and busybox's stat both print, and print alike (busybox
 * has no `--printf`, no escapes in a format and no birth time). The names come last but one because only they
 * could hold odd characters; a user or group name with a space is not parsed (neither tool can make one).
 */
export const STAT_FORMAT = '%f %s %u %g %X %Y %h %U %G';

/** One `STAT_FORMAT` line's fields; sticky, so a listing is read field line by field line. */
const FIELDS = /([0-9a-f]+) (\d+) (\d+) (\d+) (-?\d+) (-?\d+) (\d+) (\S+) (\S+)/y;

/** A file as `stat` saw it. */
export interface FileInfo {
  attrs: Attributes;
  links: number;
  user: string;
  group: string;
}

/** An entry of a directory listing. */
export interface ListedFile {
  name: string;
  info: FileInfo;
}

/** SFTP version 3 carries times as unsigned 32-bit seconds: earlier than 1970 shows as 1970, later than 2106 as 2106. */
function seconds(text: string): number {
  return Math.min(Math.max(Number(text), 0), 0xffffffff);
}

/** The fields of `STAT_FORMAT` at `at` in `text`, and where they end. */
function fieldsAt(text: string, at: number): { info: FileInfo; end: number } | undefined {
  FIELDS.lastIndex = at;
  const m = FIELDS.exec(text);
  if (!m) return undefined;
  const [
    ,
    mode = '',
    size = '',
    uid = '',
    gid = '',
    atime = '',
    mtime = '',
    links = '',
    user = '',
    group = '',
  ] = m;
  return {
    info: {
      attrs: {
        mode: parseInt(mode, 16),
        size: Number(size),
        uid: Number(uid),
        gid: Number(gid),
        atime: seconds(atime),
        mtime: seconds(mtime),
      },
      links: Number(links),
      user,
      group,
    },
    end: FIELDS.lastIndex,
  };
}

/** The output of `stat -c STAT_FORMAT` for one file; undefined when it is not that. */
export function parseStat(output: string): FileInfo | undefined {
  const fields = fieldsAt(output, 0);
  return fields && /^\s*$/.test(output.slice(fields.end)) ? fields.info : undefined;
}

/**
 * The output of `LIST_SCRIPT`: the directory's names, each ended by NUL, then an empty name, then one
 * `STAT_FORMAT %n` line for each name `stat` could read, in the same order. A name may hold a newline, so the lines
 * are not split on newlines: each name is looked for, in order, as the end of the next line (a name `stat` could not
 * read, such as a pattern that matched nothing, has no line and is skipped). Undefined when it is not that output.
 */
export function parseListing(output: string): ListedFile[] | undefined {
  const split = output.indexOf('\0\0');
  if (split < 0) return undefined;
  const names = output.slice(0, split).split('\0');
  const files: ListedFile[] = [];
  let at = split + 2;
  for (const name of names) {
    const fields = fieldsAt(output, at);
    if (!fields) continue;
    const line = ` ${name}\n`;
    if (!output.startsWith(line, fields.end)) continue;
    files.push({ name, info: fields.info });
    at = fields.end + line.length;
  }
  return files;
}

const FILE_TYPES: Record<number, string> = {
  0o010000: 'p',
  0o020000: 'c',
  0o040000: 'd',
  0o060000: 'b',
  0o100000: '-',
  0o120000: 'l',
  0o140000: 's',
};

/** `ls -l`'s first column: the type, then rwx three times with the set-id and sticky bits folded in. */
export function modeString(mode: number): string {
  const type = FILE_TYPES[mode & 0o170000] ?? '?';
  const triple = (shift: number, special: number, letter: string): string => {
    const bits = (mode >> shift) & 7;
    const x = bits & 1;
    const s = mode & special;
    return (
      (bits & 4 ? 'r' : '-') +
      (bits & 2 ? 'w' : '-') +
      (s ? (x ? letter : letter.toUpperCase()) : x ? 'x' : '-')
    );
  };
  return type + triple(6, 0o4000, 's') + triple(3, 0o2000, 's') + triple(0, 0o1000, 't');
}

const MONTHS = ['Jan', 'Feb', 'Mar', 'Apr', 'May', 'Jun', 'Jul', 'Aug', 'Sep', 'Oct', 'Nov', 'Dec'];
/** `ls` shows the time of day for files changed within about half a year, and the year for older ones. */
const RECENT_SECONDS = 182 * 24 * 3600;

/** `ls -l`'s date column, in UTC: the gateway does not know the container's time zone. */
function lsDate(mtime: number, now: number): string {
  const d = new Date(mtime * 1000);
  const day = `${MONTHS[d.getUTCMonth()]} ${String(d.getUTCDate()).padStart(2)}`;
  if (Math.abs(now - mtime) < RECENT_SECONDS) {
    return `${day} ${String(d.getUTCHours()).padStart(2, '0')}:${String(d.getUTCMinutes()).padStart(2, '0')}`;
  }
  return `${day}  ${d.getUTCFullYear()}`;
}

/** The `ls -l` line of a file; `now` in seconds since the epoch. */
export function longname(name: string, info: FileInfo, now: number): string {
  const { attrs } = info;
  return [
    modeString(attrs.mode),
    String(info.links).padStart(3),
    info.user.padEnd(8),
    info.group.padEnd(8),
    String(attrs.size).padStart(8),
    lsDate(attrs.mtime, now),
    name,
  ].join(' ');
}
