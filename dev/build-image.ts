// `npm run image`: builds Sealion's image (dev/image.ts) as an OCI archive and prints its digest and size;
// `npm run image -- --rootfs DIR` writes the image's files to a folder instead (what the Dockerfile copies);
// `npm run image -- --next` builds the next release of the same tree (its version and tunnel protocol minor one up,
// dev/image.ts's nextRelease), what the upgrade test upgrades to.
import { relative } from 'node:path';
import { buildImage, buildNextImage, writeRootfs } from './image.ts';
const at = process.argv.indexOf('--rootfs');
const log = (line: string): void => console.log(line);
if (at > 0) {
  const dir = process.argv[at + 1];
  if (!dir) throw new Error('--rootfs needs a folder');
  writeRootfs(dir, log);
  console.log(`wrote the image's files to ${dir}`);
} else {
  const started = Date.now();
  const image = process.argv.includes('--next') ? await buildNextImage(log) : await buildImage(log);
  const mib = (bytes: number): string => `${(bytes / 1048576).toFixed(1)} MiB`;
  console.log(`built ${image.name} in ${((Date.now() - started) / 1000).toFixed(1)}s`);
  console.log(`  archive: ${relative(process.cwd(), image.archive)}`);
  console.log(`  digest:  ${image.digest}`);
  console.log(`  size:    ${mib(image.compressedBytes)} compressed, ${mib(image.unpackedBytes)} unpacked`);
}
