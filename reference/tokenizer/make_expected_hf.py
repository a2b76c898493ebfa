#!/usr/bin/env python3
"""Expected token ids from HF `tokenizers` (the Rust library, via its Python binding).

    pip install tokenizers
    python3 reference/tokenizer/make_expected_hf.py --tokenizer .../tokenizer.json \
        [--corpus tests/fixtures/tokenizer/corpus.jsonl] [--out expected.jsonl] [--flags | --prefix-space]

Same output format as make_expected.mjs: one JSON array of ids per corpus line, in order, from
Tokenizer.encode(text, add_special_tokens=False).ids. With --flags, the tokenizer is first patched with
tests/fixtures/tokenizer/flags_patch.json (added-token flags), the corpus defaults to corpus_flags.jsonl
and the output to expected_flags_qwen3.jsonl. With --prefix-space, the ByteLevel step's add_prefix_space
is set (every Split piece then shows in the ids) and the output is expected_prefix_space_qwen3.jsonl.
The C++ test applies the same changes.
Compare the result with the committed file: `cmp out.jsonl tests/fixtures/tokenizer/expected_qwen3_hf.jsonl`.
"""
import argparse
import json
import pathlib

from tokenizers import Tokenizer, __version__

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "tokenizer"


def apply_flags_patch(tokenizer_json, patch):
    # Mirrors applyFlagsPatch in make_expected_hf_node.mjs and apply_flags_patch in the C++ test.
    by_content = {t["content"]: t for t in tokenizer_json["added_tokens"]}
    for content, flags in patch["modify"].items():
        by_content[content].update(flags)
    tokenizer_json["added_tokens"].extend(patch["add"])
    return tokenizer_json


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--corpus")
    ap.add_argument("--out")
    ap.add_argument("--flags", action="store_true")
    ap.add_argument("--prefix-space", action="store_true")
    a = ap.parse_args()
    corpus = a.corpus or str(FIXTURES / ("corpus_flags.jsonl" if a.flags else "corpus.jsonl"))
    default_out = ("expected_flags_qwen3.jsonl" if a.flags else
                   "expected_prefix_space_qwen3.jsonl" if a.prefix_space else "expected_qwen3_hf.jsonl")
    out = a.out or str(FIXTURES / default_out)

    with open(a.tokenizer, encoding="utf-8") as f:
        tokenizer_json = json.load(f)
    if a.flags:
        with open(FIXTURES / "flags_patch.json", encoding="utf-8") as f:
            tokenizer_json = apply_flags_patch(tokenizer_json, json.load(f))
    if a.prefix_space:
        tokenizer_json["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = True
    tok = Tokenizer.from_str(json.dumps(tokenizer_json))

    with open(corpus, encoding="ascii", newline="") as f:
        texts = [json.loads(line) for line in f.read().split("\n") if line]
    with open(out, "w", encoding="ascii", newline="\n") as f:
        for text in texts:
            ids = tok.encode(text, add_special_tokens=False).ids
            f.write(json.dumps(ids, separators=(",", ":")) + "\n")
    print(f"tokenizers {__version__}: wrote {len(texts)} id lists to {out}")


if __name__ == "__main__":
    main()
