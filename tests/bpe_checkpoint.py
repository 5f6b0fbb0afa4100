"""A target laid out as Llama-3.1-8B-Instruct is on the Hub, in miniature: a byte-level BPE
`tokenizer.json` whose post-processor puts `<|begin_of_text|>` before every text, a chat template
that writes it itself, the tokenizer's end `<|eot_id|>`, and a `generation_config.json` whose
`eos_token_id` lists three ends (`<|end_of_text|>`, `<|eom_id|>`, `<|eot_id|>`) and which
recommends sampling at temperature 0.6, top_p 0.9 (SAMPLING, as Llama 3.1's does); random Llama
weights whose vocabulary is padded past the tokenizer's (as Qwen's is; MASK_ID lies in the padding,
for DFlash), and a draft model cut from the target's first layers. Made here, offline, in a second.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from trtspec.prompts import load_prompts

BOS, END_OF_TEXT, EOM, EOT = "<|begin_of_text|>", "<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"
SPECIALS = (BOS, END_OF_TEXT, EOM, EOT, "<|start_header_id|>", "<|end_header_id|>")
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
    "{% endif %}"  # Qwen3's switch, set by a request's chat_template_kwargs
)
VOCAB = 400  # the tokenizer's
MASK_ID = VOCAB  # the model's vocabulary has 8 more ids
SAMPLING = {"temperature": 0.6, "top_p": 0.9}


def _meet_the_ends(model: LlamaForCausalLM, tokenizer, ends: list[int]) -> None:
    """Random weights would rarely pick a special token, so each end takes the output row of one of
    the tokens greedy decoding picks most, plus noise: it then wins about every other time that
    token would, and the prompts end on each of them."""
    emitted: list[int] = []
    with torch.no_grad():
        for prompt in load_prompts("code")[:4] + load_prompts("math")[:4] + load_prompts("chat")[:4]:
            ids = torch.tensor([tokenizer(prompt).input_ids])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=24,
                                 eos_token_id=None, pad_token_id=0)
            emitted += out[0, ids.shape[1]:].tolist()
        head = model.lm_head.weight  # [V, hidden]
        common = [t for t, _ in Counter(emitted).most_common() if t not in ends]
        for end, token in zip(ends, common, strict=False):
            head[end] = head[token] + 0.05 * head[token].abs().mean() * torch.randn_like(head[token])


def bpe_tokenizer() -> tuple[PreTrainedTokenizerFast, dict[str, int]]:
    """The target's byte-level BPE tokenizer (Llama 3's kind); -> it and the special tokens' ids."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=list(SPECIALS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(load_prompts("code") + load_prompts("math") + load_prompts("chat"), trainer)
    ids = {name: bpe.token_to_id(name) for name in SPECIALS}
    bpe.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, ids[BOS])])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token=BOS, eos_token=EOT)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer, ids


def write_bpe_target(target_dir: Path, draft_dir: Path, seed: int = 0) -> dict[str, int]:
    """Write the target and its draft model; -> the special tokens' ids."""
    tokenizer, ids = bpe_tokenizer()
    tokenizer.save_pretrained(target_dir)

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer) + 8, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         max_position_embeddings=512, tie_word_embeddings=False, bos_token_id=ids[BOS],
                         eos_token_id=ids[EOT])
    target = LlamaForCausalLM(config)
    _meet_the_ends(target, tokenizer, [ids[END_OF_TEXT], ids[EOM], ids[EOT]])
    target.generation_config.eos_token_id = [ids[END_OF_TEXT], ids[EOM], ids[EOT]]
    target.generation_config.update(do_sample=True, **SAMPLING)
    target.save_pretrained(target_dir)

    target.model.layers = target.model.layers[:2]  # the draft: the target's first two layers
    target.config.num_hidden_layers = 2
    target.save_pretrained(draft_dir)
    return ids


def metaspace_tokenizer() -> PreTrainedTokenizerFast:
    """A BPE tokenizer in SentencePiece's manner (Llama 2's, Mistral's): spaces are "▁" in the
    pieces and decoding drops the space a text starts with, so a piece decoded alone loses the
    space it has in context."""
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    bpe.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<unk>", "<s>", "</s>"],
                                  show_progress=False)
    bpe.train_from_iterator(load_prompts("code") + load_prompts("math") + load_prompts("chat"), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def byte_fallback_tokenizer() -> PreTrainedTokenizerFast:
    """A SentencePiece tokenizer with byte fallback, as Llama 2's and Mistral's `tokenizer.json`:
    a character outside the pieces is spelt by byte ids `<0xXX>`, and decoding joins a run of them
    into text, the whole run U+FFFD where it is not valid UTF-8 (so the text of a run's first bytes
    changes as later ones come)."""
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<unk>", "<s>", "</s>"],
                                  show_progress=False)
    bpe.train_from_iterator(load_prompts("code") + load_prompts("math") + load_prompts("chat"), trainer)
    spec = json.loads(bpe.to_str())
    vocab = spec["model"]["vocab"]
    for byte in range(256):
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    spec["model"]["byte_fallback"] = True
    bpe = Tokenizer.from_str(json.dumps(spec))
    bpe.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    return PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


LLAMA2_TEMPLATE = (  # Llama 2's chat format: the answer follows "[/INST]", its first piece a word's "▁"
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
    "{% else %} {{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
)


def write_sentencepiece_target(target_dir: Path, draft_dir: Path, seed: int = 0) -> None:
    """A target laid out as Llama-2-7b-chat is (`byte_fallback_tokenizer`: its decoder strips a
    text's first space; `<s>` before every text, `</s>` its end, Llama 2's chat template), random
    Llama weights, and a draft model cut from its first layers."""
    tokenizer = byte_fallback_tokenizer()
    tokenizer.add_bos_token = True
    tokenizer.chat_template = LLAMA2_TEMPLATE
    tokenizer.save_pretrained(target_dir)
    bos, eos = tokenizer.convert_tokens_to_ids(["<s>", "</s>"])
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         max_position_embeddings=512, tie_word_embeddings=False, bos_token_id=bos,
                         eos_token_id=eos)
    target = LlamaForCausalLM(config)
    with torch.no_grad():  # byte ids mostly lose (a trained model spells few characters in bytes)
        target.lm_head.weight[tokenizer.convert_tokens_to_ids([f"<0x{b:02X}>" for b in range(256)])] *= 0.1
    _meet_the_ends(target, tokenizer, [eos])
    target.generation_config.eos_token_id = eos
    target.save_pretrained(target_dir)
    target.model.layers = target.model.layers[:2]
    target.config.num_hidden_layers = 2
    target.save_pretrained(draft_dir)
