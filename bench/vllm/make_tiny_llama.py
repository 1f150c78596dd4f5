#!/usr/bin/env python3
"""Write a tiny random-weight Llama checkpoint for the vLLM P/D benchmark.

No download: the weights come from torch.manual_seed(0), so the same
torch/transformers versions give the same checkpoint.  The shape is chosen
for vLLM's CPU attention: head_dim 64 (head_dim 16 is refused), 2 layers,
2 KV heads.  There is no tokenizer; run vLLM with skip_tokenizer_init=True and
token-id prompts.

Per token the KV cache holds layers(2) x {K,V}(2) x kv_heads(2) x head_dim(64)
x bf16(2 B) = 1 KiB, so one 128-token vLLM block is 128 KiB.

--size large: 8 layers, 8 KV heads (= attention heads), head_dim 128, hidden 1024,
max 4096 positions: 32 KiB of KV per token, so a prompt of 1-2k tokens moves 32-64 MiB
and the transfer, not the engine step, dominates a P/D request. Run it with a larger
KV cache and model length (e.g. pd_e2e.py --kv-cache-bytes 1073741824 --max-model-len
2304 --min-len 1000 --max-len 2000).

usage: make_tiny_llama.py [--out DIR] [--size tiny|large]
       (default: $TMPDIR/hixl-vllm/tiny-llama, or tiny-llama-large for --size large)
"""
import argparse
import os
import tempfile


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    ap.add_argument("--size", choices=["tiny", "large"], default="tiny")
    args = ap.parse_args()
    name = "tiny-llama" if args.size == "tiny" else "tiny-llama-large"
    args.out = args.out or os.path.join(tempfile.gettempdir(), "hixl-vllm", name)

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if args.size == "tiny":
        cfg = LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          max_position_embeddings=512, torch_dtype="bfloat16")
    else:
        cfg = LlamaConfig(vocab_size=512, hidden_size=1024, intermediate_size=2048,
                          num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=8,
                          max_position_embeddings=4096, torch_dtype="bfloat16")
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    os.makedirs(args.out, exist_ok=True)
    model.save_pretrained(args.out, safe_serialization=True)
    print("saved", args.out, sorted(os.listdir(args.out)))


if __name__ == "__main__":
    main()
