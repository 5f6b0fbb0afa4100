"""Triton model repository for the torch flavour, loadable by a stock `tritonserver`.

    <out>/model_repository/<name>/config.pbtxt          from Triton's ModelConfig protobuf
    <out>/model_repository/<name>/1/model.py            glue: trtspec.triton.model.TritonPythonModel
    <out>/model_repository/<name>/1/build_config.yaml   the build config, model paths made absolute

One decoupled Python-backend model runs tokenizer, drafter and target (the orchestrator). Its
tensors are the names TensorRT-LLM's templates taught users (`text_input`, `max_tokens`, …).
Instances: one on the CPU without `gpus`, else one per listed GPU (`instance_group` with
`count: 1` and those `gpus`, which Triton reads as one instance on each); each GPU instance puts
its models on its own GPU (`placed_on_instance`).
"""

from __future__ import annotations

from pathlib import Path

import yaml
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from trtspec.config import BUILTIN_PREFIX, BuildConfig
from trtspec.errors import ConfigError
from trtspec.triton.trtllm_inputs import TRTLLM_INPUTS

REPO_DIR = "model_repository"
BUILD_CONFIG_FILE = "build_config.yaml"
VERSION = "1"
BUILD_FROM_YAML = "../../.."  # from model_repository/<name>/1/build_config.yaml up to the build folder

# (name, TYPE_*, dims, optional); one request per call, so no batch dimension (max_batch_size 0).
INPUTS = (
    ("text_input", "TYPE_STRING", (1,), True),  # the prompt: text_input or input_ids
    ("input_ids", "TYPE_INT32", (-1,), True),  # the prompt as token ids (add_special_tokens has no effect)
    ("max_tokens", "TYPE_INT32", (1,), False),
    ("temperature", "TYPE_FP32", (1,), True),
    ("top_p", "TYPE_FP32", (1,), True),
    ("top_k", "TYPE_INT32", (1,), True),
    ("min_p", "TYPE_FP32", (1,), True),  # vLLM's: drop tokens below min_p × the most likely one's p
    ("random_seed", "TYPE_UINT64", (1,), True),
    ("stream", "TYPE_BOOL", (1,), True),
    ("stop_words", "TYPE_STRING", (-1,), True),
    # false: text_input already holds the tokenizer's special tokens (a rendered chat template)
    ("add_special_tokens", "TYPE_BOOL", (1,), True),
    ("stop_token_ids", "TYPE_INT32", (-1,), True),  # more ids that end the request (vLLM's)
    ("ignore_eos", "TYPE_BOOL", (1,), True),  # the end ids do not end the request (vLLM's)
    # the k most likely tokens' log-probabilities at each generated token (implies return_log_probs)
    ("num_top_log_probs", "TYPE_INT32", (1,), True),
    ("return_prompt_log_probs", "TYPE_BOOL", (1,), True),  # the prompt's tokens' too (vLLM's prompt_logprobs)
    # OpenAI's logit_bias: token ids and the bias added to each one's logit, as two lists of one length
    ("logit_bias_ids", "TYPE_INT32", (-1,), True),
    ("logit_bias_values", "TYPE_FP32", (-1,), True),
    # a reasoning budget (TensorRT-LLM's thinking_token_budget): the block's end forced after this many
    # tokens in it; the block ends with thinking_end ("</think>"), and opens with thinking_start at the
    # answer's start ("": the prompt opened it)
    ("thinking_token_budget", "TYPE_INT32", (1,), True),
    ("thinking_start", "TYPE_STRING", (1,), True),
    ("thinking_end", "TYPE_STRING", (1,), True),
    # predicted outputs (OpenAI's prediction): text the answer is expected to repeat, drafted from
    ("prediction", "TYPE_STRING", (1,), True),
    # vLLM's cache_salt: prefix reuse and the lookup pool share only among requests sent with the same
    ("cache_salt", "TYPE_STRING", (1,), True),
) + tuple((i.name, i.dtype, i.dims, True) for i in TRTLLM_INPUTS)  # what NVIDIA's clients send TensorRT-LLM
OUTPUTS = (
    ("text_output", "TYPE_STRING", (1,)),
    ("output_ids", "TYPE_INT32", (-1,)),  # generated ids only (this response's, when streaming)
    ("accepted_tokens", "TYPE_INT32", (1,)),  # draft tokens the target accepted
    ("draft_tokens", "TYPE_INT32", (1,)),  # draft tokens proposed
    ("target_forwards", "TYPE_INT32", (1,)),  # target forward passes the request took, prefill included
    # prompt tokens kept from a slot's earlier request (limits.prefix_reuse), not prefilled again
    ("cached_tokens", "TYPE_INT32", (1,)),
    # with a prediction, in the totals: drafts taken from it, and those accepted
    ("prediction_tokens", "TYPE_INT32", (1,)),
    ("accepted_prediction_tokens", "TYPE_INT32", (1,)),
    # a sampled request's seed, with the totals: random_seed as sent, or the one drawn for it
    ("sampling_seed", "TYPE_UINT64", (1,)),
    # with the totals: "stop" (an end or stop id, a stop word) or "length" (max_tokens reached)
    ("finish_reason", "TYPE_STRING", (1,)),
    # with return_log_probs: each generated id's log p under the target (raw logits), as output_ids
    ("output_log_probs", "TYPE_FP32", (-1,)),
    ("cum_log_probs", "TYPE_FP32", (1,)),  # their sum so far
    ("top_log_probs", "TYPE_FP32", (-1, -1)),  # [n, num_top_log_probs], most likely first
    ("top_log_prob_ids", "TYPE_INT32", (-1, -1)),  # [n, num_top_log_probs] their token ids
    # with return_prompt_log_probs, in the first response: the prompt's tokens after its first
    ("prompt_log_probs", "TYPE_FP32", (-1,)),
    ("prompt_top_log_probs", "TYPE_FP32", (-1, -1)),
    ("prompt_top_log_prob_ids", "TYPE_INT32", (-1, -1)),
)

MODEL_PY = '''"""Generated by `trtspec build`: the orchestration model lives in trtspec.triton.model."""

from trtspec.triton.model import TritonPythonModel  # noqa: F401
'''


def model_config(config: BuildConfig) -> mc.ModelConfig:
    """config.pbtxt of the orchestration model."""
    pb = mc.ModelConfig(name=config.name, backend="python", max_batch_size=0)
    # decoupled: a request gets one response per decode step when it asks to stream
    pb.model_transaction_policy.decoupled = True
    if config.gpus:
        pb.instance_group.add(count=1, kind=mc.ModelInstanceGroup.KIND_GPU, gpus=list(config.gpus))
    else:
        pb.instance_group.add(count=1, kind=mc.ModelInstanceGroup.KIND_CPU)
    for name, dtype, dims, optional in INPUTS:
        pb.input.add(name=name, data_type=mc.DataType.Value(dtype), dims=list(dims), optional=optional)
    for name, dtype, dims in OUTPUTS:
        pb.output.add(name=name, data_type=mc.DataType.Value(dtype), dims=list(dims))
    return pb


def instances_on_this_machine(model_config: dict) -> int:
    """Instances Triton starts from a model config (its JSON form, as a model's `initialize` gets
    it): each group's `count` on each of its `gpus`, or `count` when it lists none."""
    return sum(int(g.get("count", 1)) * max(1, len(g.get("gpus") or [])) for g in
               model_config.get("instance_group") or [{}])


def placed_on_instance(config: BuildConfig, kind: str, device_id: str | int) -> BuildConfig:
    """The config one model instance decodes with. A GPU instance (the config's `gpus`: one
    instance on each) puts the target and drafter of flavour torch on ITS GPU, cuda:<device id>,
    whatever `device` says (else every instance would share cuda:0); a CPU instance, and the
    other flavours, keep the config as written. `kind`, `device_id`: Triton's
    `model_instance_kind` and `model_instance_device_id`."""
    if kind != "GPU" or config.flavour != "torch":
        return config
    on = {"device": f"cuda:{int(device_id)}"}
    update = {"target": config.target.model_copy(update=on)}
    if config.drafter is not None:
        update["drafter"] = config.drafter.model_copy(update=on)
    return config.model_copy(update=update)


def check_stub_paths(paths: dict[str, Path | None]) -> None:
    """Refuse, by name, a path Triton's Python backend cannot open: its stub starts Python isolated,
    in the C locale, which names files in ASCII (a folder "sortie-é" failed to load with an
    'ascii' codec error, a target under "modèles" was said not to exist). `paths`: what each is."""
    for what, path in paths.items():
        if path is not None and not str(Path(path).resolve()).isascii():
            raise ConfigError(f"{what} {path} holds characters other than ASCII, which Triton's Python "
                              "backend cannot open (its stub names files in ASCII): use an ASCII path")


def _portable_path(path: str, resolved: Path) -> str:
    return path if path.startswith(BUILTIN_PREFIX) else str(resolved.resolve())


def served_build_config(config: BuildConfig, engine_is_build: bool = False) -> dict:
    """The config the model loads: as given, with relative model paths made absolute;
    `engine_is_build`: engine.folder is the build folder holding the repository (flavour engine),
    written relative to the YAML so the build can be moved or copied to the GPU node whole."""
    data = config.model_dump(mode="json", exclude_none=True)
    data["target"]["path"] = _portable_path(config.target.path, config.target.resolved_path)
    if config.drafter is not None:
        data["drafter"]["path"] = _portable_path(config.drafter.path, config.drafter.resolved_path)
        if config.drafter.resolved_sps_table is not None:
            data["drafter"]["schedule"]["sps_table"] = str(config.drafter.resolved_sps_table.resolve())
    # the two reuse switches as the YAML set them (both set must agree; one set, the other follows it):
    # written whole, a switch left at its default contradicted the other's setting at load; flavour
    # engine keeps no prefix (true, asked, is refused), so its switch is left out
    if config.flavour == "engine" or "prefix_reuse" not in config.limits.model_fields_set:
        del data["limits"]["prefix_reuse"]
    if config.deployment is not None and "enable_block_reuse" not in config.deployment.model_fields_set:
        data["deployment"].pop("enable_block_reuse", None)
    if engine_is_build:
        data["engine"]["folder"] = BUILD_FROM_YAML
    elif config.engine is not None and config.engine.resolved_folder is not None:
        data["engine"]["folder"] = str(config.engine.resolved_folder)
    return data


def write_triton_repo(config: BuildConfig, out_dir: Path, engine_is_build: bool = False) -> list[Path]:
    """Write `<out_dir>/model_repository/` for `config` (flavour torch, or engine with its
    `engine.folder`; `engine_is_build`: that folder is `out_dir` itself); returns the files
    written."""
    engine_folder = config.engine.resolved_folder if config.engine else None
    if config.flavour == "trtllm" or (config.flavour == "engine" and engine_folder is None):
        raise ConfigError(
            f"config {config.name!r}: the Triton orchestration repository runs flavour torch, or flavour "
            f"engine over exported graphs (`trtspec build --flavour engine` writes both), not "
            f"{config.flavour!r}" + (" without engine.folder" if config.flavour == "engine" else "")
        )
    for part in (config.target, config.drafter):
        if part is not None and not part.resolved_path.is_dir():
            raise ConfigError(f"config {config.name!r}: model folder {part.resolved_path} does not exist")
    model_dir = out_dir / REPO_DIR / config.name
    (model_dir / VERSION).mkdir(parents=True, exist_ok=True)
    pbtxt = model_dir / "config.pbtxt"
    pbtxt.write_text(text_format.MessageToString(model_config(config)), encoding="utf-8")
    model_py = model_dir / VERSION / "model.py"
    model_py.write_text(MODEL_PY, encoding="utf-8")
    build_yaml = model_dir / VERSION / BUILD_CONFIG_FILE
    served = served_build_config(config, engine_is_build)
    build_yaml.write_text("# build config served by this model (generated by trtspec build)\n"
                          + yaml.safe_dump(served, sort_keys=False), encoding="utf-8")
    return [pbtxt, model_py, build_yaml]
