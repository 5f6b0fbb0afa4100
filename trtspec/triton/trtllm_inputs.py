"""The optional inputs of TensorRT-LLM's Triton text models, so NVIDIA's clients can talk to ours.

genai-perf / perf_analyzer in their TensorRT-LLM mode, and scripts written for TensorRT-LLM's
`ensemble` / `tensorrt_llm_bls` models, send inputs beyond `text_input` and `max_tokens`; Triton
refuses a whole request that names an input the model does not declare. So the model declares
every optional text-level input of those configs, honours what the decoder can, and refuses the
rest per request with an error naming the input and its value; a value equal to the input's
default (or an empty list) changes nothing and passes.

Names and types read from NVIDIA/TensorRT-LLM `triton_backend/all_models/inflight_batcher_llm/`
`ensemble/config.pbtxt` @ 2a9abd9536aa62ad3e4b9314be9286b1b1be523b and
`tensorrt_llm_bls/config.pbtxt` @ bff88ea886779f832686acb3f165e2b919c95b77 (`min_tokens`, `seed`);
the older names `min_length` / `random_seed` from triton-inference-server/tensorrtllm_backend
`all_models/inflight_batcher_llm/ensemble/config.pbtxt` @ 039e5b4ae8a1decdf6955a23a0f6700ac085b63b
and from genai-perf's converter (triton-inference-server/perf_analyzer
`genai-perf/genai_perf/inputs/converters/tensorrtllm_converter.py` @ 053bdb77156c49b55b920d450e3b460060724d39,
which sends `min_length`). Multimodal, LoRA-weight and prompt-tuning inputs are declared too, so
such a request is refused by name rather than by Triton's generic message.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from trtspec.errors import TrtspecError


class UnsupportedInput(TrtspecError):
    """A TensorRT-LLM input with a value trtspec cannot honour; the message names both."""


@dataclass(frozen=True, slots=True)
class TrtllmInput:
    name: str
    dtype: str  # Triton TYPE_*
    dims: tuple[int, ...]
    default: object = None  # the value that changes nothing; None = only absence (or empty) passes
    why: str = ""  # why another value is refused


_LOGITS = "trtspec returns log-probabilities (return_log_probs), not logits"

# Honoured inputs (read by trtspec.triton.request), then the refused ones.
HONOURED = (
    TrtllmInput("exclude_input_in_output", "TYPE_BOOL", (1,)),
    TrtllmInput("min_length", "TYPE_INT32", (1,)),  # older ensemble and genai-perf
    TrtllmInput("min_tokens", "TYPE_INT32", (1,)),  # current ensemble / tensorrt_llm_bls
    TrtllmInput("end_id", "TYPE_INT32", (1,)),
    TrtllmInput("seed", "TYPE_UINT64", (1,)),  # current name of random_seed
    TrtllmInput("pad_id", "TYPE_INT32", (1,)),  # outputs are never padded, so any pad id holds
    TrtllmInput("return_log_probs", "TYPE_BOOL", (1,)),  # output_log_probs, cum_log_probs
    # applied to the target's p at every draft position (trtspec.spec.penalties)
    TrtllmInput("repetition_penalty", "TYPE_FP32", (1,)),
    TrtllmInput("presence_penalty", "TYPE_FP32", (1,)),
    TrtllmInput("frequency_penalty", "TYPE_FP32", (1,)),
    # a guide the text must match, masked into p at every draft position (trtspec.spec.grammar)
    TrtllmInput("guided_decoding_guide_type", "TYPE_STRING", (1,)),
    TrtllmInput("guided_decoding_guide", "TYPE_STRING", (1,)),
    # words the text may not hold, banned from p along every draft path (trtspec.spec.penalties)
    TrtllmInput("bad_words", "TYPE_STRING", (-1,)),
)
REFUSED = (
    TrtllmInput("decoder_text_input", "TYPE_STRING", (1,), "", "trtspec serves decoder-only targets"),
    TrtllmInput("num_return_sequences", "TYPE_INT32", (1,), 1, "one sequence per request"),
    TrtllmInput("beam_width", "TYPE_INT32", (1,), 1, "no beam search: speculative decoding is 1-beam"),
    TrtllmInput("length_penalty", "TYPE_FP32", (1,), 1.0, "it only applies to beam search"),
    TrtllmInput("return_context_logits", "TYPE_BOOL", (1,), False, _LOGITS),
    TrtllmInput("return_generation_logits", "TYPE_BOOL", (1,), False, _LOGITS),
    TrtllmInput("return_perf_metrics", "TYPE_BOOL", (1,), False, "see the metrics port instead"),
    TrtllmInput("return_num_input_tokens", "TYPE_BOOL", (1,), False, "not returned"),
    TrtllmInput("return_num_output_tokens", "TYPE_BOOL", (1,), False, "count `output_ids` instead"),
    TrtllmInput("prompt_embedding_table", "TYPE_FP16", (-1, -1), None, "no prompt tuning"),
    TrtllmInput("prompt_vocab_size", "TYPE_INT32", (1,), 0, "no prompt tuning"),
    TrtllmInput("prompt_table_extra_id", "TYPE_UINT64", (1,), 0, "no prompt tuning"),
    TrtllmInput("embedding_bias_words", "TYPE_STRING", (-1,), None,
                "bias token ids with logit_bias_ids and logit_bias_values instead"),
    TrtllmInput("embedding_bias_weights", "TYPE_FP32", (-1,), None,
                "bias token ids with logit_bias_ids and logit_bias_values instead"),
    TrtllmInput("lora_task_id", "TYPE_UINT64", (1,), None, "no LoRA adapters"),
    TrtllmInput("lora_weights", "TYPE_FP16", (-1, -1), None, "no LoRA adapters"),
    TrtllmInput("lora_config", "TYPE_INT32", (-1, 3), None, "no LoRA adapters"),
)
TRTLLM_INPUTS = HONOURED + REFUSED


def _plain(value: np.ndarray, is_list: bool):
    """The value as Python (bytes decoded): one, or the list of them for a list input."""
    items = [v.decode("utf-8", errors="replace") if isinstance(v, bytes) else v.item()
             if isinstance(v, np.generic) else v for v in value.reshape(-1)]
    return items[0] if value.size == 1 and not is_list else items


def check_refused(get: Callable[[str], np.ndarray | None]) -> None:
    """Raise UnsupportedInput for the first refused input whose value is not its default."""
    for spec in REFUSED:
        value = get(spec.name)
        if value is None or value.size == 0:
            continue
        plain = _plain(value, spec.dims[0] == -1)
        if spec.default is not None and value.size == 1 and plain == spec.default:
            continue
        if spec.default == "" and all(v in ("", b"") for v in value.reshape(-1)):
            continue
        shown = plain if value.size <= 4 else f"a tensor of shape {list(value.shape)}"
        passes = "" if spec.default is None else f"; only {spec.default!r} is accepted"
        raise UnsupportedInput(f"{spec.name}={shown!r} is not supported by trtspec: {spec.why}{passes}")
