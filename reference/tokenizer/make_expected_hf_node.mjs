// Expected token ids from HF `tokenizers` itself (the Rust library) through its official Node binding,
// the npm package `tokenizers` (napi-rs; the package ships prebuilt binaries, nothing is compiled).
// Same output format as make_expected.mjs. Install the binding outside the repo once:
//
//   npm install --prefix ~/.cache/kev-native/deps/hf-tokenizers tokenizers@0.23.2
//   node reference/tokenizer/make_expected_hf_node.mjs [--deps DIR] [--tokenizer F] [--corpus F]
//        [--out F] [--flags | --prefix-space] [--bench SECONDS]
//
// --flags: patch the tokenizer with tests/fixtures/tokenizer/flags_patch.json (added-token flags and
// extra added tokens), read corpus_flags.jsonl and write expected_flags_qwen3.jsonl. --prefix-space: set
// the ByteLevel step's add_prefix_space, which makes every Split piece visible in the ids, and write
// expected_prefix_space_qwen3.jsonl. The C++ test applies the same changes. --bench times sequential awaited encode calls, so it includes per-call N-API/promise
// overhead and is not a measure of the Rust code alone.
import { createRequire } from "node:module";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const fixtures = path.resolve(here, "..", "..", "tests", "fixtures", "tokenizer");

function parse_args(argv) {
  const args = {
    deps: process.env.KEV_DEPS_DIR ?? path.join(os.homedir(), ".cache", "kev-native", "deps"),
    tokenizer: null, corpus: null, out: null, flags: false, prefix_space: false, bench: 0,
  };
  for (let i = 2; i < argv.length; ++i) {
    const key = argv[i].replace(/^--/, "");
    if (key === "flags") { args.flags = true; continue; }
    if (key === "prefix-space") { args.prefix_space = true; continue; }
    if (!(key in args) || i + 1 >= argv.length) {
      console.error("usage: make_expected_hf_node.mjs [--deps DIR] [--tokenizer F] [--corpus F] [--out F] [--flags | --prefix-space] [--bench S]");
      process.exit(1);
    }
    args[key] = key === "bench" ? Number(argv[++i]) : argv[++i];
  }
  args.tokenizer ??= path.join(args.deps, "tokenizer-qwen3", "models", "tokenizer.json");
  args.corpus ??= path.join(fixtures, args.flags ? "corpus_flags.jsonl" : "corpus.jsonl");
  args.out ??= path.join(fixtures, args.flags ? "expected_flags_qwen3.jsonl"
                                   : args.prefix_space ? "expected_prefix_space_qwen3.jsonl" : "expected_qwen3_hf.jsonl");
  return args;
}

// Mirrors apply_flags_patch in make_expected_hf.py and in tests/text/tokenizer_test.cpp.
function apply_flags_patch(tokenizer_json, patch) {
  for (const [content, flags] of Object.entries(patch.modify)) {
    Object.assign(tokenizer_json.added_tokens.find((t) => t.content === content), flags);
  }
  tokenizer_json.added_tokens.push(...patch.add);
  return tokenizer_json;
}

const args = parse_args(process.argv);
const require = createRequire(path.join(args.deps, "hf-tokenizers", "package.json"));
const { Tokenizer } = require("tokenizers");
const version = require("tokenizers/package.json").version;

let tokenizer_json = JSON.parse(fs.readFileSync(args.tokenizer, "utf8"));
if (args.flags) {
  tokenizer_json = apply_flags_patch(tokenizer_json, JSON.parse(fs.readFileSync(path.join(fixtures, "flags_patch.json"), "utf8")));
}
if (args.prefix_space) tokenizer_json.pre_tokenizer.pretokenizers[1].add_prefix_space = true;
const tokenizer = Tokenizer.fromString(JSON.stringify(tokenizer_json));
for (const t of tokenizer_json.added_tokens) {
  const id = tokenizer.tokenToId(t.content);
  if (id !== t.id) {
    console.error(`added token ${JSON.stringify(t.content)}: file says id ${t.id}, HF assigned ${id}`);
    process.exit(2);
  }
}

const corpus = fs.readFileSync(args.corpus, "utf8").split("\n").filter((l) => l.length > 0).map((l) => JSON.parse(l));
const lines = [];
for (const text of corpus) {
  const encoding = await tokenizer.encode(text, null, { addSpecialTokens: false });
  lines.push(JSON.stringify(Array.from(encoding.getIds())));
}
fs.writeFileSync(args.out, lines.join("\n") + "\n");
console.log(`tokenizers (node) ${version}: wrote ${lines.length} id lists to ${args.out}`);

if (args.bench > 0) {
  const bytes = corpus.reduce((n, s) => n + Buffer.byteLength(s, "utf8"), 0);
  for (const text of corpus) await tokenizer.encode(text, null, { addSpecialTokens: false });
  let passes = 0;
  let elapsed = 0;
  const start = process.hrtime.bigint();
  while (elapsed < args.bench) {
    for (const text of corpus) await tokenizer.encode(text, null, { addSpecialTokens: false });
    ++passes;
    elapsed = Number(process.hrtime.bigint() - start) / 1e9;
  }
  console.log(`encode throughput (awaited per call): ${((bytes * passes) / elapsed / 1e6).toFixed(2)} MB/s (${passes} passes over ${bytes} bytes in ${elapsed.toFixed(2)} s)`);
}
