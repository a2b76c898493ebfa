#!/usr/bin/env python3
"""HF transformers eager BF16 baseline for kev_benchmark, on the same weights (docs/benchmarks.md).

Loads a kev-native exported model directory (model.json + weights.safetensors, e.g. a synthetic model
from `kev_export --synthetic 4b`) into transformers' own Qwen3_5TextModel (eager attention, the torch
fallback Gated DeltaNet), in BF16 on the GPU, and times the work kev_benchmark does for a workload:

  prefill            one forward over the state (Ls tokens) with use_cache=True
  cached evaluation  the question rows, continuing from a copy of that cache. HF has no packed
                     multi-row continuation, so the rows run as ONE continuation sequence of
                     sum(row tokens) tokens: the same projection work; attention inside the rows is
                     slightly larger than kev's per-row causal mask.
  new                prefill + cached evaluation

The token counts come from kev_benchmark's --json output of the same run (state_tokens, row_tokens),
so both sides do the same amount of work. Token ids are random (the weights are random too).

  python3 reference/bench/hf_baseline.py --model DIR --kev-json short.json [long.json ...] [--runs 10]

Prints one JSON object per workload (medians in ms). The Kev pointer head is not run (a few hundred
FLOPs).
"""
import argparse
import copy
import inspect
import json
import pathlib
import statistics
import sys
import time

import torch
from safetensors.torch import load_file


def build_model(model_dir: pathlib.Path, device: str):
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextModel

    arch = json.loads((model_dir / "model.json").read_text())["architecture"]
    accepted = set(inspect.signature(Qwen3_5TextConfig.__init__).parameters)
    kwargs = {k: v for k, v in arch.items() if k in accepted or k == "attn_output_gate"}
    try:
        config = Qwen3_5TextConfig(**kwargs)
    except TypeError:
        kwargs.pop("attn_output_gate", None)
        config = Qwen3_5TextConfig(**kwargs)
    config._attn_implementation = "eager"
    with torch.device("meta"):
        model = Qwen3_5TextModel(config)
    model = model.to_empty(device=device).to(torch.bfloat16)
    state = load_file(str(model_dir / "weights.safetensors"))
    hf_state = {}
    for name, t in state.items():
        if name.startswith("kev_head."):
            continue
        if name.endswith("linear_attn.conv1d.weight") and t.dim() == 2:
            t = t.unsqueeze(1)  # ours [C, K], HF's depthwise Conv1d [C, 1, K]
        hf_state[name] = t.to(torch.bfloat16)
    missing, unexpected = model.load_state_dict(hf_state, strict=False)
    # Buffers (rotary inv_freq) are not in the file: rebuild them on the real device.
    missing = [m for m in missing if "inv_freq" not in m]
    if missing or unexpected:
        sys.exit(f"weights do not match Qwen3_5TextModel: missing {missing[:5]}, unexpected {unexpected[:5]}")
    if hasattr(model, "rotary_emb"):
        model.rotary_emb = type(model.rotary_emb)(config=config, device=device)
    model.eval()
    return model, config


def timed(fn, warmups: int, runs: int):
    for _ in range(warmups):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(runs):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, type=pathlib.Path)
    ap.add_argument("--kev-json", required=True, type=pathlib.Path, nargs="+", help="kev_benchmark --json outputs")
    ap.add_argument("--warmups", type=int, default=3)
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()

    model, config = build_model(args.model, "cuda")
    for kev_json in args.kev_json:
        kev = json.loads(kev_json.read_text())
        print(json.dumps(run_workload(model, config, kev, args.warmups, args.runs)), flush=True)


def run_workload(model, config, kev, warmups, runs):
    Ls, n_rows = int(kev["state_tokens"]), int(kev["row_tokens"])
    g = torch.Generator().manual_seed(0)
    state_ids = torch.randint(0, config.vocab_size, (1, Ls), generator=g).cuda()
    row_ids = torch.randint(0, config.vocab_size, (1, n_rows), generator=g).cuda()

    with torch.inference_mode():
        def prefill():
            return model(input_ids=state_ids, use_cache=True).past_key_values

        cache = prefill()
        positions = torch.arange(Ls, Ls + n_rows, device="cuda").unsqueeze(0)

        def evaluate():
            model(input_ids=row_ids, past_key_values=copy.deepcopy(cache), position_ids=positions, use_cache=True)

        # deepcopy of the cache is part of what HF needs to reuse an immutable prefix; time it separately.
        copy_ms = timed(lambda: copy.deepcopy(cache), warmups, runs)
        prefill_ms = timed(prefill, warmups, runs)
        eval_ms = timed(evaluate, warmups, runs)

    return {
        "baseline": "hf-transformers-eager-bf16",
        "model": kev.get("model"),
        "workload": kev.get("workload"),
        "state_tokens": Ls,
        "row_tokens": n_rows,
        "prefill_ms": prefill_ms,
        "cached_evaluation_ms": eval_ms - copy_ms,
        "cache_copy_ms": copy_ms,
        "prefill_plus_evaluation_ms": prefill_ms + eval_ms - copy_ms,
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0),
    }


if __name__ == "__main__":
    main()
