"""A Llama/Qwen3 target forward over a preallocated KV cache: the decode step a CUDA graph can hold.

It drives the Hugging Face model's own modules (embeddings, each layer's norms, q/k/v/o
projections, Qwen3's q/k norms, MLP, final norm, LM head, rotary embedding), so the weights and
the arithmetic are the real architecture's; only the cache and attention plumbing is ours, done
the way gpt-fast does it, because a captured graph replays fixed kernels on fixed addresses:

- the cache is one [batch, kv_heads, max_len, head_dim] buffer per layer for K and for V,
  allocated once; the fed tokens' K/V are scattered into it at their positions (a tensor, so the
  same graph serves every step);
- attention reads the first `kv_len` slots (a static bucket) under a mask built on the device from
  the positions (slot j is visible to a token at position p iff j <= p), so rows of different
  lengths share one graph and nothing waits on a host-side value;
- grouped-query heads are folded into the query length ([b, kv_heads, group * n, d]) so each
  kv head's cache is read once, not copied per query head.

Equal to the model's own forward: tests/test_synthetic.py compares logits on the CPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from trtspec.models.dflash import apply_rope


class StaticKVTarget:
    """Runs `model` over a static KV cache for up to `max_batch` rows of `max_len` positions."""

    def __init__(self, model: PreTrainedModel, max_batch: int, max_len: int):
        config = model.config
        self.model = model
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.group = self.num_heads // self.num_kv_heads
        self.max_batch, self.max_len = max_batch, max_len
        param = next(model.parameters())
        shape = (max_batch, self.num_kv_heads, max_len, self.head_dim)
        layers = config.num_hidden_layers
        self.k_cache = [torch.zeros(shape, dtype=param.dtype, device=param.device) for _ in range(layers)]
        self.v_cache = [torch.zeros(shape, dtype=param.dtype, device=param.device) for _ in range(layers)]

    def fill_random(self, generator: torch.Generator) -> None:
        """Random cache contents: timing a forward at context c needs c cached slots, not a prefill."""
        for cache in self.k_cache + self.v_cache:
            cache.normal_(generator=generator)

    def _mask(self, positions: torch.Tensor, kv_len: int, dtype: torch.dtype) -> torch.Tensor:
        """Additive mask [b, 1, group * n, kv_len]: 0 where slot j <= the row's position, else -inf."""
        b, n = positions.shape
        slots = torch.arange(kv_len, device=positions.device)
        visible = slots[None, None, :] <= positions[:, :, None]  # [b, n, kv_len]
        mask = torch.zeros(visible.shape, dtype=dtype, device=positions.device)
        mask = mask.masked_fill(~visible, float("-inf"))
        return mask[:, None].expand(b, self.group, n, kv_len).reshape(b, 1, self.group * n, kv_len)

    def _attention(self, layer_idx: int, attn, x, cos, sin, positions, kv_len, mask) -> torch.Tensor:
        b, n, _ = x.shape
        d, h, kvh = self.head_dim, self.num_heads, self.num_kv_heads
        q = attn.q_proj(x).view(b, n, h, d)
        k = attn.k_proj(x).view(b, n, kvh, d)
        v = attn.v_proj(x).view(b, n, kvh, d)
        if hasattr(attn, "q_norm"):  # Qwen3 normalises each head before RoPE; Llama does not
            q, k = attn.q_norm(q), attn.k_norm(k)
        q = apply_rope(q.transpose(1, 2), cos, sin)  # [b, h, n, d]
        k = apply_rope(k.transpose(1, 2), cos, sin)  # [b, kvh, n, d]
        slot = positions[:, None, :, None].expand(b, kvh, n, d)
        k_cache = self.k_cache[layer_idx][:b]
        v_cache = self.v_cache[layer_idx][:b]
        k_cache.scatter_(2, slot, k)
        v_cache.scatter_(2, slot, v.transpose(1, 2))
        # query head i reads kv head i // group (HF's repeat_kv order): fold the group into rows
        q = q.reshape(b, kvh, self.group * n, d)
        keys, values = k_cache[:, :, :kv_len], v_cache[:, :, :kv_len]
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)  # [b, kvh, group * n, d]
        out = out.view(b, kvh, self.group, n, d).permute(0, 3, 1, 2, 4).reshape(b, n, h * d)
        return attn.o_proj(out)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_len: int) -> torch.Tensor:
        """Logits [b, n, V] of input_ids [b, n] at positions [b, n]; attention over slots < kv_len.

        Every position must be < kv_len <= max_len; slots a row has not written are masked only if
        they lie past its position, so a row's earlier slots must hold its context."""
        inner = self.model.model
        h = inner.embed_tokens(input_ids)  # [b, n, H]
        cos, sin = inner.rotary_emb(h, positions)  # [b, n, d] each
        mask = self._mask(positions, kv_len, h.dtype)
        for i, layer in enumerate(inner.layers):
            x = layer.input_layernorm(h)
            h = h + self._attention(i, layer.self_attn, x, cos, sin, positions, kv_len, mask)
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.model.lm_head(inner.norm(h))
