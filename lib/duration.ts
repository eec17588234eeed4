// Durations as Go and kubectl write them, for settings and flags that take one.

/**
 * A duration in hours, minutes and seconds (`12h`, `1h30m`, `90s`), in milliseconds; undefined for anything else (days,
 * fractions and units smaller than a second have no use here).
 */
export function parseDuration(text: string): number | undefined {
  const parts = /^(?:(\d{1,4})h)?(?:(\d{1,6})m)?(?:(\d{1,8})s)?$/.exec(text);
  if (!parts || text === '') return undefined;
  const [, h = '0', m = '0', s = '0'] = parts;
  return ((Number(h) * 60 + Number(m)) * 60 + Number(s)) * 1000;
}
