"""τ of the tiny DFlash pipeline in bfloat16 with the drafter's RoPE inverse frequencies in float32
(as loaded since 926d19c) and rounded to bfloat16 (as before), at short and long contexts; greedy,
whole blocks, counted (not timed), so it repeats exactly:

    .venv/bin/python scripts/rope_precision_tau.py
"""
import torch

from trtspec.bench.loop_overhead import tiny_pipeline
from trtspec.prompts import load_prompts

p = tiny_pipeline(torch.device("cpu"), cuda_graphs=False, dtype="bfloat16", schedule="full")
drafter = p.drafter.model
exact = {n: b.clone() for n, b in drafter.named_buffers() if n.endswith("inv_freq")}
long_text = "".join(load_prompts("code"))  # every code prompt, one long context
prompts = {"short": load_prompts("code")[:8], "long": [long_text[-i * 300 - 3000:] for i in range(4)]}
for label, texts in prompts.items():
    for rounded in (False, True):
        for name, buf in exact.items():
            owner, _, attr = name.rpartition(".")
            value = buf.bfloat16().float() if rounded else buf
            drafter.get_submodule(owner).register_buffer(attr, value, persistent=False)
        tokens = forwards = 0
        for text in texts:
            r = p.decoder.generate(p.tokenizer.encode(text), 128)
            tokens, forwards = tokens + len(r.token_ids), forwards + r.num_target_calls
        ctx = sum(len(p.tokenizer.encode(t)) for t in texts) // len(texts)
        print(f"{label:5s} (mean prompt {ctx} tokens) inv_freq {'bf16' if rounded else 'fp32'}: "
              f"tau {tokens / forwards:.3f} ({tokens} tokens / {forwards} forwards)")
