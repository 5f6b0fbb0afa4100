"""What a drafter is trained on: prompts for the target to continue, and the target's own
continuations of them (the data every recipe here distils from).

A prompts file is JSONL, one object per line, either `{"prompt": "text"}` (continued as text,
encoded as `tokenizer(text)` encodes it) or `{"messages": [{"role": ..., "content": ...}, ...]}`
(rendered by the target's chat template with the assistant's turn opened, as the server renders
a chat request: a drafter for a chat model learns the answers it will be asked to draft); or
plain text, one prompt per line. Prompts are encoded by the target's own tokenizer, and each
continuation ends at the first of the target's end ids (`trtspec.tokenizer.end_ids_of`).
"""

from __future__ import annotations

import hashlib
import json
import pickle
from pathlib import Path

import torch
from tqdm import tqdm

from trtspec import json_text
from trtspec.errors import TrtspecError
from trtspec.files import replaced

Messages = list[dict]
Prompt = str | Messages  # text to continue, or a conversation to answer


def _messages(value, where: str) -> Messages:
    if not isinstance(value, list) or not value:
        raise TrtspecError(f"{where}: 'messages' must be a non-empty list of {{role, content}} objects")
    for i, message in enumerate(value):
        if not (isinstance(message, dict) and isinstance(message.get("role"), str)
                and isinstance(message.get("content"), str)):
            raise TrtspecError(f"{where}: messages[{i}] must be an object with 'role' and 'content' strings")
    return value


def load_prompt_file(path: Path, chat: bool = True) -> list[Prompt]:
    """The prompts of a JSONL (or .json) file (`prompt` or, when `chat`, `messages` per line) or of a text
    file (one per line); a TrtspecError naming the file and line for anything else."""
    if not path.is_file():
        raise TrtspecError(f"prompts file {path} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise TrtspecError(f"prompts file {path} is not UTF-8 text (byte {exc.start})") from None
    fields = "a 'prompt' string or 'messages'" if chat else "a 'prompt' string"
    prompts: list[Prompt] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if path.suffix not in (".jsonl", ".json"):  # a .json file of JSON lines is read as JSON too
            prompts.append(line)
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if json_text.half_pair(row) is not None:  # no character: no UTF-8 to tokenize
            raise TrtspecError(f"{path}:{n}: a string holds half a UTF-16 surrogate pair (a \\ud800-style "
                               "escape without its other half), which is no character")
        if isinstance(row, dict) and isinstance(row.get("prompt"), str):
            if not row["prompt"]:
                raise TrtspecError(f"{path}:{n}: the prompt is empty")
            prompts.append(row["prompt"])
        elif chat and isinstance(row, dict) and "messages" in row:
            prompts.append(_messages(row["messages"], f"{path}:{n}"))
        else:
            raise TrtspecError(f"{path}:{n}: expected a JSON object with {fields}")
    if not prompts:
        raise TrtspecError(f"prompts file {path} holds no prompts")
    return prompts


def encode_prompts(target_dir: Path, hf_config, prompts: list[Prompt],
                   source: Path) -> tuple[list[list[int]], tuple[int, ...]]:
    """Each prompt as the target's token ids (text as `tokenizer(text)`, a conversation through
    the target's chat template, which writes its own special tokens), and the ids that end the
    target's continuations, as they end a served request; one tokenizer load for both."""
    from trtspec.chat import load_chat_template
    from trtspec.tokenizer import end_ids_of, load_tokenizer

    tokenizer = load_tokenizer(target_dir, hf_config)
    template = None
    if any(not isinstance(p, str) for p in prompts):
        template = load_chat_template(target_dir, hf_config, tokenizer)
        if template is None:
            raise TrtspecError(f"{source} holds 'messages' but the target {target_dir} has no chat template; "
                               "give 'prompt' text instead")
    encoded = []
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            ids = tokenizer.encode(prompt)
        else:
            try:
                text = template.render(prompt)
            except Exception as exc:  # noqa: BLE001 - a template's raise_exception or a rendering error
                raise TrtspecError(f"{source}: the chat template refused conversation {i + 1}: "
                                   f"{' '.join(str(exc).split())}") from None
            ids = tokenizer.encode(text, add_special_tokens=False)
        if not ids:
            raise TrtspecError(f"{source}: prompt {i + 1} encodes to no tokens")
        encoded.append(ids)
    return encoded, end_ids_of(target_dir, tokenizer, hf_config.vocab_size)


def check_fits_context(prompts: list[list[int]], response_tokens: int, hf_config, source,
                       target_dir: Path, option: str = "--response-tokens") -> None:
    """Refuse prompts whose continuation would run past the target's `max_position_embeddings`:
    the target's features there are outside what it was trained on, and the server refuses such
    requests, so a drafter would learn positions it never drafts at."""
    limit = getattr(hf_config, "max_position_embeddings", None)
    if not limit:
        return
    over = [i for i, p in enumerate(prompts) if len(p) + response_tokens > limit]
    if over:
        first, size = over[0] + 1, len(prompts[over[0]])
        raise TrtspecError(f"{source}: prompt {first} is {size} tokens, and with {option} {response_tokens} "
                           f"needs {size + response_tokens} positions, more than the target's "
                           f"max_position_embeddings {limit} ({target_dir}/config.json); {len(over)} of "
                           f"{len(prompts)} prompts are that long: shorten them or lower {option}")


@torch.inference_mode()
def regenerate(model, prompts: list[list[int]], response_tokens: int, end_ids: tuple[int, ...],
               batch: int = 64):
    """Greedy continuations by the target, row r continuing prompts[r] up to and including the
    first of `end_ids`. Returns (sequences [N, P+R] padded with end_ids[0], valid lengths [N])."""
    ends = torch.tensor(end_ids or (-1,))
    by_len: dict[int, list[int]] = {}  # prompts of one length batch without padding
    for r, p in enumerate(prompts):
        by_len.setdefault(len(p), []).append(r)
    seqs: list[torch.Tensor | None] = [None] * len(prompts)
    lens = [0] * len(prompts)
    pad = end_ids[0] if end_ids else 0
    bar = tqdm(total=len(prompts), desc="regenerate", unit="prompt")
    for rows in by_len.values():
        for i in range(0, len(rows), batch):
            chunk = rows[i : i + batch]
            ids = torch.tensor([prompts[r] for r in chunk])
            # an explicit mask keeps transformers from guessing one from pad == eos (and warning)
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=response_tokens, eos_token_id=list(end_ids) or None,
                                 pad_token_id=pad)
            for r, row in zip(chunk, out, strict=True):
                seqs[r] = row
                hit = torch.isin(row[ids.shape[1] :], ends).nonzero()
                lens[r] = ids.shape[1] + (int(hit[0]) + 1 if len(hit) else response_tokens)
            bar.update(len(ids))
    bar.close()
    width = max(len(s) for s in seqs)
    padded = torch.full((len(seqs), width), pad, dtype=torch.long)
    for r, s in enumerate(seqs):
        padded[r, : len(s)] = s
    return padded, torch.tensor(lens)


@torch.inference_mode()
def regenerated_data(target, target_dir: Path, prompts_path: Path, response_tokens: int,
                     data_file: Path, trained_on: bool = True) -> dict:
    """The target's own continuations of the prompts, cached in `data_file` (resumable runs and
    drafters trained from one regeneration share it): seqs [N, S], lens [N], prompt_lens [N].
    A cached file regenerated from another target, prompts file or --response-tokens is refused
    when `trained_on` (a checkpoint beside it trained on it: resuming on new data would silently
    ignore those options), and regenerated otherwise (a run refused before its first step, e.g.
    by responses too short for one block, is rerun with the options its error asked for)."""
    source = {"target": str(Path(target_dir).resolve()),
              "prompts_sha256": hashlib.sha256(Path(prompts_path).read_bytes()).hexdigest(),
              "response_tokens": response_tokens}
    data = None
    if data_file.is_file():
        data = load_run_file(data_file, "delete it to regenerate them")
        cached = data.get("source")
        if cached is not None and cached != source and not trained_on:
            data = None
        elif cached is not None and cached != source:
            names = {"target": "--target", "prompts_sha256": "--prompts",
                     "response_tokens": "--response-tokens"}
            differ = [k for k in source if cached.get(k) != source[k]]
            was = "; ".join(f"{names[k]} was {cached.get(k)}" for k in differ if k != "prompts_sha256")
            raise TrtspecError(f"{data_file} holds continuations regenerated for another "
                               f"{' / '.join(names[k] for k in differ)}{f' ({was})' if was else ''}: give a "
                               f"new --out, or delete that file to regenerate with these options")
    if data is not None:
        return data
    prompts, end_ids = encode_prompts(target_dir, target.config, load_prompt_file(prompts_path), prompts_path)
    check_fits_context(prompts, response_tokens, target.config, prompts_path, target_dir)
    seqs, lens = regenerate(target, prompts, response_tokens, end_ids)
    data = {"seqs": seqs, "lens": lens, "prompt_lens": torch.tensor([len(p) for p in prompts]),
            "source": source}
    with replaced(data_file) as tmp:
        torch.save(data, tmp)
    return data


def load_run_file(path: Path, remedy: str) -> dict:
    """A `torch.save`d file of an earlier training run (`checkpoint/data.pt`, `state.pt`), or one
    line naming it when it cannot be read (the run that wrote it may have been killed mid-write)."""
    try:
        data = torch.load(path)
    except (RuntimeError, EOFError, pickle.UnpicklingError, OSError) as exc:
        first = " ".join(str(exc).split())[:160]
        raise TrtspecError(f"{path} cannot be read ({first}): {remedy}, or give a new --out") from None
    if not isinstance(data, dict):
        raise TrtspecError(f"{path} is not a trtspec training file: {remedy}, or give a new --out")
    return data
