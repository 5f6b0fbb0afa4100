"""Triton deployment without a server: the generated repository against golden copies, protobuf
round trip, instance groups, request checks, the text stream and the streaming decoder hook.

Regenerate the golden files after an intended change with
    TRTSPEC_UPDATE_GOLDEN=1 .venv/bin/pytest tests/test_triton_repo.py
and review the diff under tests/golden/triton/ before committing it.
"""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest
import yaml
from click.testing import CliRunner
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from trtspec.cli import main
from trtspec.config import ASSETS_DIR, load_build_config
from trtspec.errors import ConfigError
from trtspec.pipeline import load_pipeline
from trtspec.serve import model_repository
from trtspec.spec.grammar import Guide
from trtspec.spec.sampling import SamplingParams
from trtspec.tokenizer import ByteTokenizer
from trtspec.triton.repo import INPUTS, OUTPUTS, model_config, write_triton_repo
from trtspec.triton.request import RequestError, TextStream, parse_request
from trtspec.triton.server import ServeError

from .conftest import REPO, assert_matches_golden

GOLDEN = REPO / "tests" / "golden" / "triton"
CONFIG = REPO / "build_configs" / "tiny-dflash.yaml"


def test_build_matches_golden(tmp_path):
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["build", str(CONFIG), "--out", str(out)])
    assert result.exit_code == 0, result.output
    produced = {p.relative_to(out).as_posix(): p.read_text() for p in out.rglob("*") if p.is_file()}
    assert_matches_golden(produced, GOLDEN / CONFIG.stem)


def test_config_pbtxt_parses_back(tmp_path):
    config = load_build_config(CONFIG)
    (pbtxt, *_rest) = write_triton_repo(config, tmp_path)
    parsed = text_format.Parse(pbtxt.read_text(), mc.ModelConfig())
    assert parsed == model_config(config)
    assert parsed.model_transaction_policy.decoupled and parsed.backend == "python"
    assert [i.name for i in parsed.input] == [name for name, *_ in INPUTS]
    assert [o.name for o in parsed.output] == [name for name, *_ in OUTPUTS]
    assert [i.name for i in parsed.input if not i.optional] == ["max_tokens"]  # and text_input or input_ids
    (group,) = parsed.instance_group
    assert group.kind == mc.ModelInstanceGroup.KIND_CPU and group.count == 1


def test_served_config_reloads_with_absolute_paths(tmp_path):
    cfg = tmp_path / "cfg.yaml"
    target = str(REPO / "trtspec/assets/tiny-target")
    cfg.write_text(CONFIG.read_text().replace("builtin:tiny-target", target))
    _, _, served = write_triton_repo(load_build_config(cfg), tmp_path / "out")
    reloaded = load_build_config(served)
    assert reloaded.target.resolved_path == (REPO / "trtspec/assets/tiny-target").resolve()
    assert yaml.safe_load(served.read_text())["drafter"]["path"] == "builtin:tiny-dflash-b16"


def test_served_config_makes_the_drafters_paths_absolute_and_serves_one_without_a_drafter(tmp_path):
    """A drafter folder and SPS table written relative to the YAML are served absolute (the served
    YAML lies elsewhere); a config without a drafter (prompt lookup alone) is served without one."""
    shutil.copytree(ASSETS_DIR / "tiny-dflash-b16", tmp_path / "models" / "dflash")
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(CONFIG.read_text().replace("builtin:tiny-dflash-b16", "models/dflash")
                   .replace("drafter:\n", "drafter:\n  schedule: {sps_table: sps.json}\n", 1))
    served = yaml.safe_load(write_triton_repo(load_build_config(cfg), tmp_path / "out")[2].read_text())
    assert served["drafter"]["path"] == str((tmp_path / "models" / "dflash").resolve())
    assert served["drafter"]["schedule"]["sps_table"] == str((tmp_path / "sps.json").resolve())
    lookup = load_build_config(REPO / "build_configs" / "tiny-lookup.yaml")
    served = yaml.safe_load(write_triton_repo(lookup, tmp_path / "lookup")[2].read_text())
    assert "drafter" not in served and served["target"]["path"] == "builtin:tiny-target"


def test_served_config_keeps_a_torch_prefix_reuse_switch_and_a_build_runs_again_over_its_repository(tmp_path):
    """flavour torch keeps limits.prefix_reuse as the YAML set it (engine leaves it out); a second
    build into the same folder rewrites the repository."""
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(CONFIG.read_text().replace("limits:\n", "limits:\n  prefix_reuse: false\n", 1))
    config = load_build_config(cfg)
    for _ in range(2):
        served = yaml.safe_load(write_triton_repo(config, tmp_path / "out")[2].read_text())
        assert served["limits"]["prefix_reuse"] is False


def test_one_instance_per_gpu(tmp_path):
    cfg = tmp_path / "gpus.yaml"
    cfg.write_text(CONFIG.read_text() + "gpus: [0, 1, 3]\n")
    parsed = text_format.Parse(
        write_triton_repo(load_build_config(cfg), tmp_path / "out")[0].read_text(), mc.ModelConfig()
    )
    (group,) = parsed.instance_group
    assert group.kind == mc.ModelInstanceGroup.KIND_GPU
    assert (group.count, list(group.gpus)) == (1, [0, 1, 3])  # Triton: `count` instances on EACH gpu


def test_each_gpu_instance_decodes_on_its_own_gpu(tmp_path):
    """Triton starts one instance per listed GPU; each puts target and drafter on cuda:<its id>
    (not every one on cuda:0); a CPU instance keeps the config's device."""
    from trtspec.triton.repo import placed_on_instance

    cfg = tmp_path / "gpus.yaml"
    cfg.write_text(CONFIG.read_text() + "gpus: [0, 1, 3]\n")
    config = load_build_config(cfg)
    placed = placed_on_instance(config, "GPU", "3")
    assert (placed.target.device, placed.drafter.device) == ("cuda:3", "cuda:3")
    assert placed.target.path == config.target.path and config.target.device == "cpu"
    assert placed_on_instance(config, "CPU", "0") is config


def test_bad_gpus_and_flavours_are_refused(tmp_path):
    cfg = tmp_path / "dup.yaml"
    cfg.write_text(CONFIG.read_text() + "gpus: [0, 0]\n")
    with pytest.raises(ConfigError, match=r"dup.yaml: field `gpus`: .*distinct"):
        load_build_config(cfg)
    engine = tmp_path / "engine.yaml"
    engine.write_text(CONFIG.read_text().replace("flavour: torch", "flavour: engine"))
    result = CliRunner().invoke(main, ["build", str(engine), "--out", str(tmp_path / "o")])
    # the engine flavour builds ONNX graphs + manifest (tests/test_engine.py) and a repo serving them
    assert result.exit_code == 0 and (tmp_path / "o" / "manifest.json").is_file(), result.output
    yaml_path = tmp_path / "o" / "model_repository/trtspec/1/build_config.yaml"
    served = yaml.safe_load(yaml_path.read_text())
    # relative to the YAML, so the build moves whole (it named the folder it was built in: a copy
    # served the original's graphs, a moved one failed naming the old path)
    assert served["flavour"] == "engine" and served["engine"]["folder"] == "../../.."
    (tmp_path / "o").rename(tmp_path / "moved")
    moved = load_build_config(tmp_path / "moved" / "model_repository/trtspec/1/build_config.yaml")
    assert moved.engine.resolved_folder.resolve() == (tmp_path / "moved").resolve()
    with pytest.raises(ConfigError, match="flavour engine over exported graphs .* without engine.folder"):
        write_triton_repo(load_build_config(engine), tmp_path / "p")
    missing = tmp_path / "missing.yaml"
    missing.write_text(CONFIG.read_text().replace("builtin:tiny-dflash-b16", "nowhere"))
    with pytest.raises(ConfigError, match="model folder .*nowhere does not exist"):
        write_triton_repo(load_build_config(missing), tmp_path / "o")


def _getter(**inputs):
    arrays = {k: np.asarray(v) for k, v in inputs.items()}
    return arrays.get


def _B(value: bool) -> np.ndarray:
    return np.array([value])


def _I32(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int32)


def _U64(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.uint64)


def _F32(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def _BYTES(*values: bytes) -> np.ndarray:
    return np.array(values, dtype=object)


GOOD = dict(text_input=np.array([b"hi"], dtype=object), max_tokens=np.array([8], dtype=np.int32))


def test_parse_request_defaults_and_values():
    req = parse_request(_getter(**GOOD), 16)
    assert (req.prompt, req.max_tokens, req.stream, req.stop_words) == ("hi", 8, False, ())
    assert req.sampling == SamplingParams()
    inputs = dict(
        temperature=np.array([0.5], dtype=np.float32),
        top_p=np.array([0.9], dtype=np.float32),
        top_k=np.array([3], dtype=np.int32),
        random_seed=np.array([2**64 - 1], dtype=np.uint64),
        stream=np.array([True]),
        stop_words=np.array([b"\n", b"x"], dtype=object),
        stop_token_ids=np.array([7, 263], dtype=np.int32),
        add_special_tokens=np.array([False]),
    )
    req = parse_request(_getter(**GOOD, **inputs), 16, vocab_size=264)
    top_p = float(np.float32(0.9))
    assert req.sampling == SamplingParams(temperature=0.5, top_p=top_p, top_k=3, seed=2**64 - 1)
    assert req.stream and req.stop_words == ("\n", "x")
    assert req.stop_token_ids == (7, 263) and not req.add_special_tokens


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(text_input=None), r"text_input is required \(or input_ids"),
        (dict(input_ids=np.array([1, 2], dtype=np.int32)), "give one of text_input .* or input_ids"),
        (dict(text_input=None, input_ids=np.array([], dtype=np.int32)), "input_ids must not be empty"),
        (dict(text_input=None, input_ids=np.array([1, 264, 3], dtype=np.int32)),
         r"input_ids must be token ids in \[0, 264\), got 264 at position 1"),
        (dict(text_input=np.array([b""], dtype=object)), "text_input must not be empty"),
        (dict(text_input=np.array([b"\xffab"], dtype=object)), r"text_input is not valid UTF-8 \(byte 0\)"),
        (dict(text_input=np.array([b"a", b"b"], dtype=object)), "text_input must hold exactly one value"),
        (dict(max_tokens=None), "max_tokens is required"),
        (dict(max_tokens=[0]), r"max_tokens must be in \[1, 16\], got 0"),
        (dict(max_tokens=[17]), r"max_tokens must be in \[1, 16\], got 17"),
        (dict(temperature=[-0.5]), "temperature must be a finite number >= 0"),
        (dict(temperature=[float("nan")]), "temperature must be a finite number >= 0"),
        (dict(top_p=[0.0]), r"top_p must be in \(0, 1\]"),
        (dict(top_p=[1.5]), r"top_p must be in \(0, 1\]"),
        (dict(top_k=[-1]), "top_k must be >= 0"),
        (dict(stop_words=np.array([b""], dtype=object)), "stop_words must not contain an empty string"),
        (dict(stop_words=np.array([b"\xc3"], dtype=object)), "stop_words is not valid UTF-8"),
        # every step searches the text for each word: one request's many long words slowed everyone's
        (dict(stop_words=np.array([b"w%d" % i for i in range(65)], dtype=object)),
         "stop_words holds 65 words; at most 64"),
        (dict(stop_words=np.array([b"ok", b"x" * 1025], dtype=object)),
         "stop_words\\[1\\] has 1025 characters; at most 1024"),
        (dict(stop_token_ids=np.array([3, -1], dtype=np.int32)),
         r"stop_token_ids must be token ids in \[0, 264\), got \[3, -1\]"),
        (dict(stop_token_ids=np.array([264], dtype=np.int32)), r"stop_token_ids must be .*got \[264\]"),
        (dict(end_id=np.array([264], dtype=np.int32)), r"end_id must be a token id in \[0, 264\), got 264"),
    ],
)
def test_parse_request_names_the_bad_parameter(change, message):
    inputs = {**GOOD, **change}
    with pytest.raises(RequestError, match=message):
        parse_request(_getter(**{k: v for k, v in inputs.items() if v is not None}), 16, vocab_size=264)


def test_parse_request_trtllm_inputs_honoured_and_defaults_pass():
    """What NVIDIA's clients send a TensorRT-LLM model: honoured inputs land in the request,
    refused ones at their default value change nothing."""
    defaults = dict(
        exclude_input_in_output=np.array([True]), pad_id=np.array([2], dtype=np.int32),
        beam_width=np.array([1], dtype=np.int32), num_return_sequences=np.array([1], dtype=np.int32),
        repetition_penalty=np.array([1.0], dtype=np.float32),
        length_penalty=np.array([1.0], dtype=np.float32),
        presence_penalty=np.array([0.0], dtype=np.float32), return_log_probs=np.array([False]),
        bad_words=np.array([], dtype=object), decoder_text_input=np.array([b""], dtype=object),
    )
    req = parse_request(_getter(**GOOD, **defaults), 16)
    assert (req.min_tokens, req.end_id, req.include_input, req.sampling.seed) == (0, None, False, None)
    assert parse_request(_getter(**GOOD, bad_words=np.array([b"foo", b" bar"], dtype=object)), 16).bad_words \
        == ("foo", " bar")
    honoured = dict(min_length=np.array([5], dtype=np.int32), end_id=np.array([10], dtype=np.int32),
                    exclude_input_in_output=np.array([False]), seed=np.array([7], dtype=np.uint64))
    req = parse_request(_getter(**GOOD, **honoured), 16)
    assert (req.min_tokens, req.end_id, req.include_input, req.sampling.seed) == (5, 10, True, 7)
    assert parse_request(_getter(**GOOD, min_tokens=np.array([3], dtype=np.int32)), 16).min_tokens == 3
    budget = dict(thinking_token_budget=np.array([4], dtype=np.int32),
                  thinking_start=np.array([b"<think>"], dtype=object))
    assert parse_request(_getter(**GOOD, **budget), 16).thinking == (4, "<think>", "</think>")
    assert parse_request(_getter(**GOOD), 16).thinking is None
    # log-probabilities: none by default, the chosen tokens' with return_log_probs, the k best's too
    # with num_top_log_probs
    assert (req.logprobs, req.ignore_eos) == (None, False)
    yes = _B(True)
    for asked, want in [(dict(return_log_probs=yes), 0), (dict(num_top_log_probs=_I32(4)), 4),
                        (dict(return_log_probs=yes, num_top_log_probs=_I32(0)), 0),
                        (dict(num_top_log_probs=_I32(0)), None)]:
        assert parse_request(_getter(**GOOD, **asked), 16).logprobs == want
    assert parse_request(_getter(**GOOD, ignore_eos=np.array([True])), 16).ignore_eos
    # penalties and logit bias reach the sampling parameters
    penalties = dict(repetition_penalty=_F32(1.5), presence_penalty=_F32(-0.5), frequency_penalty=_F32(0.25))
    req = parse_request(_getter(**GOOD, **penalties, **_bias([7, 3], [-100, 2.5])), 16, vocab_size=264)
    s = req.sampling
    assert (s.repetition_penalty, s.presence_penalty, s.frequency_penalty) == (1.5, -0.5, 0.25)
    assert s.logit_bias == ((7, -100.0), (3, 2.5)) and s.penalized
    assert not parse_request(_getter(**GOOD), 16).sampling.penalized
    assert parse_request(_getter(**GOOD, min_p=_F32(0.25)), 16).sampling.min_p == 0.25
    # guided decoding, as TensorRT-LLM's inputs name it; an empty type is none
    assert parse_request(_getter(**GOOD, **_guide(b"regex", rb"\d+")), 16).guide == Guide("regex", r"\d+")
    assert parse_request(_getter(**GOOD, **_guide(b"", b"")), 16).guide is None
    # more ids than the vocabulary holds: refused before any is looked at (a late duplicate in a long
    # list once took a count per id)
    with pytest.raises(RequestError, match="logit_bias_ids holds 265 ids; the vocabulary has 264"):
        parse_request(_getter(**GOOD, **_bias(list(range(265)), [0.0] * 265)), 16, vocab_size=264)


def _bias(ids: list[int], values: list[float]) -> dict[str, np.ndarray]:
    return dict(logit_bias_ids=np.array(ids, dtype=np.int32),
                logit_bias_values=np.array(values, dtype=np.float32))


def _guide(kind: bytes, text: bytes) -> dict[str, np.ndarray]:
    return dict(guided_decoding_guide_type=np.array([kind], dtype=object),
                guided_decoding_guide=np.array([text], dtype=object))


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(beam_width=np.array([4], dtype=np.int32)), r"beam_width=4 is not supported .* only 1 is"),
        (dict(length_penalty=np.array([1.5], dtype=np.float32)), r"length_penalty=1.5 is not"),
        (dict(min_p=np.array([-0.5], dtype=np.float32)), r"min_p must be in \[0, 1\] \(0 = off\), got -0.5"),
        (dict(repetition_penalty=np.array([0.0], dtype=np.float32)), r"repetition_penalty must be .* > 0"),
        (dict(presence_penalty=np.array([2.5], dtype=np.float32)), r"presence_penalty must be in \[-2, 2\]"),
        (dict(frequency_penalty=np.array([np.nan], dtype=np.float32)), r"frequency_penalty must be in"),
        (dict(logit_bias_ids=np.array([3], dtype=np.int32)), "logit_bias_ids needs logit_bias_values"),
        (dict(logit_bias_values=np.array([3], dtype=np.float32)), "logit_bias_values needs logit_bias_ids"),
        (_bias([3, 4], [1]), "logit_bias_ids holds 2 ids but logit_bias_values 1 values"),
        (_bias([3, 4], [1, 101]), r"logit_bias_values\[1\] must be in \[-100, 100\], got 101"),
        (_bias([3, 3], [1, 2]), "logit_bias_ids names token 3 twice"),
        (_bias([-1], [1]), "logit_bias_ids must be token ids >= 0, got -1 at position 0"),
        (dict(embedding_bias_words=np.array([b"x"], dtype=object)), "bias token ids with logit_bias_ids"),
        (dict(return_context_logits=np.array([True])), "return_context_logits=True is not supported"),
        (dict(num_top_log_probs=np.array([21], dtype=np.int32)), r"num_top_log_probs must be in \[0, 20\]"),
        (dict(num_top_log_probs=np.array([2], dtype=np.int32), return_log_probs=np.array([False])),
         "num_top_log_probs=2 asks for log-probabilities that return_log_probs=false turns off"),
        (dict(bad_words=np.array([b"x", b""], dtype=object)), "bad_words must not contain an empty string"),
        (dict(thinking_token_budget=np.array([-1], dtype=np.int32)),
         "thinking_token_budget must be >= 0, got -1"),
        (dict(thinking_end=np.array([b"</think>"], dtype=object)),
         "thinking_end needs thinking_token_budget, the budget it delimits"),
        (dict(thinking_token_budget=np.array([4], dtype=np.int32),
              thinking_end=np.array([b""], dtype=object)), "thinking_end must not be empty"),
        (dict(lora_task_id=np.array([3], dtype=np.uint64)), "lora_task_id=3 is not supported by trtspec"),
        (dict(num_return_sequences=np.array([2], dtype=np.int32)), "num_return_sequences=2"),
        (dict(guided_decoding_guide=np.array([b"{}"], dtype=object)),
         "guided_decoding_guide needs guided_decoding_guide_type"),
        (_guide(b"xml", b"<a/>"), "guided_decoding_guide_type must be one of json, json_schema, regex, "
                                  "ebnf_grammar, got 'xml'"),
        (_guide(b"regex", b""), "guided_decoding_guide: a regex guide needs its text"),
        (_guide(b"json", b"{}"), "guided_decoding_guide must be empty for guided_decoding_guide_type 'json'"),
        (dict(**_guide(b"json", b""), min_tokens=np.array([2], dtype=np.int32)),
         "min_tokens=2 cannot be combined with guided_decoding_guide_type"),
        (dict(min_length=np.array([9], dtype=np.int32)), r"min_length must be in \[0, max_tokens=8\], got 9"),
        (dict(min_tokens=np.array([-1], dtype=np.int32)), r"min_tokens must be in \[0, max_tokens=8\]"),
        (dict(end_id=np.array([-1], dtype=np.int32)), "end_id must be a token id >= 0, got -1"),
        (dict(seed=np.array([1], dtype=np.uint64), random_seed=np.array([2], dtype=np.uint64)),
         "random_seed=2 and seed=1 name the same setting and disagree"),
    ],
)
def test_parse_request_refuses_trtllm_inputs_it_cannot_honour(change, message):
    with pytest.raises(RequestError, match=message):
        parse_request(_getter(**GOOD, **change), 16)


@pytest.mark.parametrize(
    "name, default, other, shown, accepted",
    [
        ("decoder_text_input", _BYTES(b""), _BYTES(b"hi"), "'hi'", "''"),
        ("num_return_sequences", _I32(1), _I32(2), "2", "1"),
        ("beam_width", _I32(1), _I32(4), "4", "1"),
        ("length_penalty", _F32(1.0), _F32(1.5), "1.5", "1.0"),
        ("return_context_logits", _B(False), _B(True), "True", "False"),
        ("return_generation_logits", _B(False), _B(True), "True", "False"),
        ("return_perf_metrics", _B(False), _B(True), "True", "False"),
        ("return_num_input_tokens", _B(False), _B(True), "True", "False"),
        ("return_num_output_tokens", _B(False), _B(True), "True", "False"),
        ("prompt_vocab_size", _I32(0), _I32(1), "1", "0"),
        ("prompt_table_extra_id", _U64(0), _U64(1), "1", "0"),
    ],
)
def test_refused_trtllm_input_passes_at_its_default_and_is_refused_by_name_otherwise(name, default, other,
                                                                                      shown, accepted):
    """What genai-perf and TensorRT-LLM's clients send at the default value changes nothing; any other
    value is refused, naming the input, the value and the one value accepted."""
    parse_request(_getter(**GOOD, **{name: default}), 16)
    with pytest.raises(RequestError, match=rf"^{name}={re.escape(shown)} is not supported by trtspec: .*"
                                          rf"; only {re.escape(accepted)} is accepted$"):
        parse_request(_getter(**GOOD, **{name: other}), 16)


def test_refused_trtllm_inputs_show_the_value_sent():
    """A list input's value is shown as a list even of one item, a one-value input's as the value
    (or every value when more arrive), up to 4 values; more as the tensor's shape."""
    for change, shown in [
        (dict(embedding_bias_words=_BYTES(b"x")), "embedding_bias_words=['x']"),
        (dict(embedding_bias_words=_BYTES(b"a", b"b")), "embedding_bias_words=['a', 'b']"),
        (dict(embedding_bias_words=_BYTES(b"")), "embedding_bias_words=['']"),  # no default: empty is a value
        (dict(beam_width=_I32(4, 4)), "beam_width=[4, 4]"),
        (dict(embedding_bias_weights=_F32(1, 2, 3, 4)), "embedding_bias_weights=[1.0, 2.0, 3.0, 4.0]"),
        (dict(embedding_bias_weights=_F32(1, 2, 3, 4, 5)), "embedding_bias_weights='a tensor of shape [5]'"),
        (dict(lora_config=np.zeros((2, 3), dtype=np.int32)), "lora_config='a tensor of shape [2, 3]'"),
        (dict(decoder_text_input=_BYTES(b"", b"x")), "decoder_text_input=['', 'x']"),
    ]:
        with pytest.raises(RequestError, match=f"^{re.escape(shown)} is not supported by trtspec"):
            parse_request(_getter(**GOOD, **change), 16)
    # an encoder text of empty strings only is no encoder text, however many
    parse_request(_getter(**GOOD, decoder_text_input=_BYTES(b"", b"")), 16)


def test_text_stream_never_splits_a_character():
    tok = ByteTokenizer()
    ids = tok.encode("aé€😀b")  # 1-, 2-, 3- and 4-byte characters
    stream = TextStream(tok.decode)
    pieces = [stream.push([i])[0] for i in ids] + [stream.finish()]
    assert "".join(pieces) == "aé€😀b" and "\ufffd" not in "".join(pieces)
    assert [p for p in pieces if p] == ["a", "é", "€", "😀", "b"]


def test_text_stream_stops_at_a_stop_word():
    tok = ByteTokenizer()
    stream = TextStream(tok.decode, stop_words=("END",))
    delta, kept = stream.push(tok.encode("abcEN"))
    assert (delta, stream.stopped) == ("abcEN", False)
    delta, kept = stream.push(tok.encode("Dxyz"))
    assert (delta, kept, stream.stopped) == ("D", tok.encode("D"), True)
    assert stream.text == "abcEND" and stream.push(tok.encode("more")) == ("", [])


def test_text_stream_heeds_a_stop_word_only_past_min_tokens():
    """min_tokens holds a stop word back as it holds the end ids, as vLLM does: a stop word that the
    first min_tokens ids write does not end the output (it ended it at once), one that ends past them
    does, also where it begins before."""
    tok = ByteTokenizer()
    ids = tok.encode("2+6=8; 8+5=13; 4+3=7")
    stream = TextStream(tok.decode, stop_words=("; ",), min_tokens=10)  # "2+6=8; 8+5"
    delta, kept = stream.push(ids)
    assert (delta, stream.stopped) == ("2+6=8; 8+5=13; ", True) and kept == ids[:15]
    stream = TextStream(tok.decode, stop_words=("; ",), min_tokens=13)  # "; " ends with id 15
    assert stream.push(ids)[0] == "2+6=8; 8+5=13; " and stream.stopped
    stream = TextStream(tok.decode, stop_words=("; ",), min_tokens=15)
    assert stream.push(ids)[0] == "2+6=8; 8+5=13; 4+3=7" and not stream.stopped
    assert TextStream(tok.decode, stop_words=("; ",)).push(ids)[0] == "2+6=8; "


def test_text_stream_leaves_an_end_ids_own_text_out():
    """An id that ends the request (`end_ids`: its end and stop ids) is kept among the ids but not
    in the text, as vLLM's and TensorRT-LLM's stop_token_ids are; an incomplete character held
    before it comes out as what it is."""
    tok = ByteTokenizer()
    stop = tok.encode("=")[0]
    stream = TextStream(tok.decode, end_ids=frozenset({stop}))
    euro = tok.encode("€")
    assert stream.push(tok.encode("2+6") + euro[:2]) == ("2+6", tok.encode("2+6") + euro[:2])
    delta, kept = stream.push([stop, *tok.encode("8")])
    assert (kept, stream.stopped) == ([stop], True)
    assert delta + stream.finish() == tok.decode(euro[:2]) and "=" not in stream.text
    assert stream.ids == tok.encode("2+6") + euro[:2] + [stop]
    plain = TextStream(tok.decode)  # the same id, not an end id: its text stays
    assert plain.push([*tok.encode("2+6"), stop])[0] == "2+6="


@pytest.fixture(scope="module")
def pipeline():
    return load_pipeline(load_build_config(CONFIG))


def test_on_tokens_streams_exactly_the_output(pipeline):
    prompt, steps = pipeline.tokenizer.encode("Q: 482 + 356\nA:"), []
    result = pipeline.decoder.generate(prompt, 60, on_tokens=lambda emitted: steps.append(emitted.ids))
    assert [t for step in steps for t in step] == result.token_ids
    assert len(steps) == result.num_target_calls  # one step per target forward, prefill included
    assert pipeline.decoder.generate(prompt, 60).token_ids == result.token_ids


def test_on_tokens_returning_true_stops(pipeline):
    prompt = pipeline.tokenizer.encode("def parse(self, text):\n")
    full = pipeline.decoder.generate(prompt, 80).token_ids
    stopped = pipeline.decoder.generate(prompt, 80, on_tokens=lambda emitted: True)
    assert stopped.token_ids == full[:1] and stopped.num_target_calls == 1
    assert stopped.finish_reason == "stop"  # the caller ended it: a stop word, not the length


def test_paths_the_python_backend_cannot_open_are_refused_by_name(tmp_path):
    """Found fuzzing build configs (2026-12-05): the stub's Python starts isolated in the C locale and
    names files in ASCII, so a build under "sortie-é" or of a target under "modèles" built, then
    failed to load under serve (an 'ascii' codec error; "does not exist" of a folder that does)."""
    target = tmp_path / "modèles" / "tgt"
    shutil.copytree(ASSETS_DIR / "tiny-target", target)
    config = tmp_path / "c.yaml"
    config.write_text(CONFIG.read_text().replace("builtin:tiny-target", str(target)), encoding="utf-8")
    for args, named in (([str(config), "--out", str(tmp_path / "o")], f"target.path {target} holds"),
                        ([str(CONFIG), "--out", str(tmp_path / "sortie-é")], "--out")):
        result = CliRunner().invoke(main, ["build", *args])
        assert result.exit_code != 0 and named in result.output and "other than ASCII" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.yaml", "modèles"]
    built = CliRunner().invoke(main, ["build", str(CONFIG), "--out", str(tmp_path / "ok")])
    assert built.exit_code == 0, built.output
    (tmp_path / "ok").rename(tmp_path / "déplacé")
    with pytest.raises(ServeError, match="DIR .*déplacé holds characters other than ASCII"):
        model_repository(tmp_path / "déplacé")
