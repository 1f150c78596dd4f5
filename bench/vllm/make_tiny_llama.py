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

--size mla: a DeepSeek-V2 (MLA: one latent of 512 + 64 per token, the size vLLM's CPU MLA
kernel takes; 2 dense layers, 4 heads), so that a KV cache is one latent per token; vLLM's CPU
MLA takes blocks of 16 tokens only (run with --block-size 16).

--size hybrid: a Gemma 2 (layers alternate sliding-window and full attention: two KV cache
groups in vLLM; 4 layers, 2 KV heads x 64, window 64).

usage: make_tiny_llama.py [--out DIR] [--size tiny|large|mla|hybrid]
       (default: $TMPDIR/hixl-vllm/tiny-llama, or tiny-llama-large for --size large)
"""
import argparse
import os
import tempfile


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    ap.add_argument("--size", choices=["tiny", "large", "mla", "hybrid"], default="tiny")
    args = ap.parse_args()
    name = {"tiny": "tiny-llama", "large": "tiny-llama-large", "mla": "tiny-deepseek-mla",
            "hybrid": "tiny-gemma2-hybrid"}[args.size]
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
    if args.size == "mla":
        from transformers import DeepseekV2Config, DeepseekV2ForCausalLM
        cfg = DeepseekV2Config(vocab_size=512, hidden_size=256, intermediate_size=512,
                               moe_intermediate_size=128, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=4,
                               kv_lora_rank=512, q_lora_rank=None, qk_rope_head_dim=64,
                               qk_nope_head_dim=64, v_head_dim=64, first_k_dense_replace=2,
                               n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
                               max_position_embeddings=512, torch_dtype="bfloat16")
        cls = DeepseekV2ForCausalLM
    elif args.size == "hybrid":
        from transformers import Gemma2Config, Gemma2ForCausalLM
        cfg = Gemma2Config(vocab_size=512, hidden_size=256, intermediate_size=512,
                           num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                           head_dim=64, sliding_window=64, max_position_embeddings=512,
                           torch_dtype="bfloat16")
        cls = Gemma2ForCausalLM
    else:
        cls = LlamaForCausalLM
    torch.manual_seed(0)
    model = cls(cfg).to(torch.bfloat16)
    os.makedirs(args.out, exist_ok=True)
    model.save_pretrained(args.out, safe_serialization=True)
    print("saved", args.out, sorted(os.listdir(args.out)))


if __name__ == "__main__":
    main()
