#!/usr/bin/env python3
"""hf_bench.py - Hugging Face transformers' DeepseekV3 on the same shapes as
tests/cuda/bench_cuda_model.c: random weights, BF16, one GPU; batch-1 and
batch-8 decode tokens/s, decode after a 4096-token prefill, and a 512-token
prefill. Prints one table and a JSON line.

    python3 scripts/hf_bench.py configs/config_16B.json [steps]
"""
import json
import sys
import time

import torch
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
from transformers.cache_utils import DynamicCache


def hf_config(ref):
    return DeepseekV3Config(
        vocab_size=ref["vocab_size"], hidden_size=ref["dim"], intermediate_size=ref["inter_dim"],
        moe_intermediate_size=ref["moe_inter_dim"], num_hidden_layers=ref["n_layers"],
        first_k_dense_replace=ref.get("n_dense_layers", 1), num_attention_heads=ref["n_heads"],
        num_key_value_heads=ref["n_heads"], n_routed_experts=ref["n_routed_experts"],
        n_shared_experts=ref["n_shared_experts"], num_experts_per_tok=ref["n_activated_experts"],
        routed_scaling_factor=ref.get("route_scale", 1.0), q_lora_rank=ref.get("q_lora_rank") or None,
        kv_lora_rank=ref["kv_lora_rank"], qk_nope_head_dim=ref["qk_nope_head_dim"],
        qk_rope_head_dim=ref["qk_rope_head_dim"], v_head_dim=ref["v_head_dim"],
        n_group=ref.get("n_expert_groups", 1), topk_group=ref.get("n_limited_groups", 1),
        max_position_embeddings=8192, torch_dtype=torch.bfloat16)


def sync_time(fn):
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t, out


@torch.no_grad()
def decode(model, bs, depth, steps, vocab):
    cache = DynamicCache()
    ids = torch.randint(0, vocab, (bs, max(depth, 1)), device="cuda")
    out = model(input_ids=ids, past_key_values=cache, use_cache=True)
    cache = out.past_key_values
    times = []
    tok = torch.randint(0, vocab, (bs, 1), device="cuda")
    for i in range(steps + 2):
        dt, out = sync_time(lambda: model(input_ids=tok, past_key_values=cache, use_cache=True))
        cache = out.past_key_values
        if i >= 2:
            times.append(dt)
    times.sort()
    return times[len(times) // 2]


@torch.no_grad()
def main():
    ref = json.load(open(sys.argv[1]))
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    cfg = hf_config(ref)
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    t = time.perf_counter()
    with torch.device("cuda"):
        model = DeepseekV3ForCausalLM(cfg)
    model.eval()
    print(f"hf: transformers model built in {time.perf_counter() - t:.1f} s, "
          f"{sum(p.numel() for p in model.parameters()) / 1e9:.2f} B parameters", flush=True)
    vocab = ref["vocab_size"]
    r = {}
    r["decode1_ms"] = decode(model, 1, 1, steps, vocab) * 1e3
    r["decode8_ms"] = decode(model, 8, 1, steps, vocab) * 1e3
    ids = torch.randint(0, vocab, (1, 512), device="cuda")
    pt = []
    for i in range(4):
        dt, _ = sync_time(lambda: model(input_ids=ids, use_cache=False))
        if i >= 1:
            pt.append(dt)
    pt.sort()
    r["prefill512_ms"] = pt[len(pt) // 2] * 1e3
    try:
        r["decode4k_ms"] = decode(model, 1, 4096, steps, vocab) * 1e3
    except torch.OutOfMemoryError as e:
        r["decode4k_ms"] = float("nan")
        print("hf: 4k decode out of memory:", e)
    print("hf transformers %s, torch %s" % (__import__("transformers").__version__, torch.__version__))
    print("%-22s %10s %10s" % ("test (HF)", "ms", "tok/s"))
    print("%-22s %10.3f %10.1f" % ("decode batch 1", r["decode1_ms"], 1e3 / r["decode1_ms"]))
    print("%-22s %10.3f %10.1f" % ("decode batch 8", r["decode8_ms"], 8e3 / r["decode8_ms"]))
    print("%-22s %10.3f %10.1f" % ("decode depth 4096", r["decode4k_ms"], 1e3 / r["decode4k_ms"]))
    print("%-22s %10.3f %10.1f" % ("prefill 512", r["prefill512_ms"], 512e3 / r["prefill512_ms"]))
    print(json.dumps({"hf": r}))


if __name__ == "__main__":
    main()
