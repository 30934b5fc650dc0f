// Parse an AsyncAPI document with the official parser; exit 1 on any error-level diagnostic.
// Usage: node validate.mjs FILE
import { readFileSync } from "node:fs";
import { Parser, DiagnosticSeverity } from "@asyncapi/parser";

const file = process.argv[2];
if (!file) {
  console.error("usage: node validate.mjs FILE");
  process.exit(2);
}
const parser = new Parser();
const { document, diagnostics } = await parser.parse(readFileSync(file, "utf8"), { source: file });
const errors = diagnostics.filter((d) => d.severity === DiagnosticSeverity.Error);
const warnings = diagnostics.filter((d) => d.severity === DiagnosticSeverity.Warning);
for (const d of [...errors, ...warnings]) {
  const level = d.severity === DiagnosticSeverity.Error ? "error" : "warning";
  console.log(`${level}: ${d.code}: ${d.message} at ${d.path.join(".")}`);
}
if (errors.length > 0 || document === undefined) {
  console.error(`asyncapi: ${file} is INVALID (${errors.length} errors)`);
  process.exit(1);
}
const channels = document.channels().length;
const messages = document.allMessages().length;
console.log(
  `asyncapi: ${file} is valid AsyncAPI ${document.version()} ` +
    `(${channels} channels, ${messages} messages, ${warnings.length} warnings)`,
);
