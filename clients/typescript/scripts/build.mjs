// Builds the package and the console's copy of the client bundle.
//
//   node scripts/build.mjs           dist/ (ES modules + .d.ts, by tsc), dist/herald-client.min.js,
//                                    and crates/herald-server/console/herald-client.js (committed:
//                                    `cargo build` embeds it, so building Herald needs no Node)
//   node scripts/build.mjs --check   fails if the committed console bundle is not what the
//                                    sources build to (CI runs this)
//   node scripts/build.mjs --size    prints the bundle sizes, minified and gzipped
import { execFileSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { gzipSync } from 'node:zlib';
import * as esbuild from 'esbuild';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const consoleBundle = join(root, '../../crates/herald-server/console/herald-client.js');
const banner =
  '// @herald/client, bundled for the web console by clients/typescript/scripts/build.mjs\n' +
  '// from clients/typescript/src. Generated: do not edit; rebuild with `npm run build`.';

const common = { absWorkingDir: root, bundle: true, format: 'esm', target: 'es2022', platform: 'browser', logLevel: 'error' };

async function bundle(opts) {
  const out = await esbuild.build({ ...common, write: false, ...opts });
  return out.outputFiles[0].contents;
}

const consoleBytes = await bundle({ entryPoints: ['src/index.ts'], banner: { js: banner }, charset: 'utf8', legalComments: 'none' });

if (process.argv.includes('--check')) {
  const committed = readFileSync(consoleBundle);
  if (!Buffer.from(consoleBytes).equals(committed)) {
    console.error(`${consoleBundle} is not what clients/typescript/src builds to: run \`npm run build\` in clients/typescript and commit it`);
    process.exit(1);
  }
  console.log('console bundle matches the sources');
  process.exit(0);
}

const sizes = async () => {
  const full = await bundle({ entryPoints: ['src/index.ts'], minify: true });
  const realtime = await bundle({ stdin: { contents: "export { Herald } from './src/client.js';", resolveDir: root, loader: 'ts' }, minify: true });
  const kib = (n) => `${(n / 1024).toFixed(1)} KiB`;
  for (const [name, b] of [['everything (Herald + HeraldServer)', full], ['Herald only', realtime]]) {
    console.log(`${name}: ${kib(b.length)} minified, ${kib(gzipSync(b, { level: 9 }).length)} minified+gzipped`);
  }
  return full;
};

if (process.argv.includes('--size')) {
  await sizes();
  process.exit(0);
}

execFileSync(process.execPath, [join(root, 'node_modules/typescript/bin/tsc'), '-p', root], { stdio: 'inherit' });
writeFileSync(join(root, 'dist/herald-client.min.js'), await sizes());
writeFileSync(consoleBundle, consoleBytes);
console.log(`built dist/ and ${consoleBundle}`);
