// Which code points HF `tokenizers` (its Oniguruma regex engine) puts in \p{L}, \p{N} and \s, for every
// code point, written as ranges to tests/fixtures/tokenizer/hf_regex_classes.txt ("L 41 5a", hex,
// inclusive). tokenizer_test.cpp checks that the C++ tokenizer's Split regexes classify every code point
// the same way; the Unicode data of PCRE2 and of HF's Oniguruma differ in version, which
// src/text/tokenizer.cpp compensates for.
//
//   npm install --prefix ~/.cache/kev-native/deps/hf-tokenizers tokenizers@0.23.2
//   node reference/tokenizer/hf_regex_classes.mjs [--deps DIR] [--out FILE]
//
// Method: a Split pre-tokenizer with pattern `\p{L}+` (resp. `\p{N}+`, `\s+`), behaviour Isolated, runs
// over "!" c1 "!" c2 "!" ...; c is in the class exactly when it comes out as a piece of its own.
import { createRequire } from "node:module";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const args = {
  deps: process.env.KEV_DEPS_DIR ?? path.join(os.homedir(), ".cache", "kev-native", "deps"),
  out: path.resolve(here, "..", "..", "tests", "fixtures", "tokenizer", "hf_regex_classes.txt"),
};
for (let i = 2; i + 1 < process.argv.length; i += 2) args[process.argv[i].replace(/^--/, "")] = process.argv[i + 1];

const require = createRequire(path.join(args.deps, "hf-tokenizers", "package.json"));
const { Tokenizer } = require("tokenizers");
const version = require("tokenizers/package.json").version;
const base = JSON.parse(fs.readFileSync(path.join(args.deps, "tokenizer-qwen3", "models", "tokenizer.json"), "utf8"));

const code_points = [];
for (let cp = 0; cp <= 0x10ffff; ++cp) {
  if ((cp < 0xd800 || cp > 0xdfff) && cp !== 0x21) code_points.push(cp);  // "!" is the separator
}

function members(pattern) {
  base.pre_tokenizer.pretokenizers[0].pattern = { Regex: pattern };
  const pre = Tokenizer.fromString(JSON.stringify(base)).getPreTokenizer();
  const inside = new Set();
  const batch = 4096;
  for (let b = 0; b < code_points.length; b += batch) {
    const chunk = code_points.slice(b, b + batch);
    const text = chunk.map((cp) => "!" + String.fromCodePoint(cp)).join("") + "!";
    // Offsets count code points; probe k sits at 2k + 1.
    for (const [, [start, end]] of pre.preTokenizeString(text)) {
      if (end === start + 1 && start % 2 === 1) inside.add(chunk[(start - 1) / 2]);
    }
  }
  return inside;
}

const lines = [`# HF tokenizers ${version} (node binding): code points in each regex class, hex ranges, inclusive`];
for (const [name, pattern] of [["L", "\\p{L}+"], ["N", "\\p{N}+"], ["S", "\\s+"]]) {
  const inside = members(pattern);
  let start = -1;
  for (let cp = 0; cp <= 0x110000; ++cp) {
    const yes = cp <= 0x10ffff && inside.has(cp);
    if (yes && start < 0) start = cp;
    if (!yes && start >= 0) {
      lines.push(`${name} ${start.toString(16)} ${(cp - 1).toString(16)}`);
      start = -1;
    }
  }
  console.log(`${name}: ${inside.size} code points`);
}
fs.writeFileSync(args.out, lines.join("\n") + "\n");
console.log(`wrote ${lines.length - 1} ranges to ${args.out}`);
