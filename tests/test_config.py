"""Build configs: every shipped one loads; a bad one names the field and the expectation."""

from __future__ import annotations

import re

import pytest
import yaml

from trtspec.config import MAX_MISTAKES, load_build_config
from trtspec.errors import ConfigError
from trtspec.strict import MAX_SHOWN

from .conftest import REPO


@pytest.mark.parametrize("path", sorted((REPO / "build_configs").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_load(path):
    config = load_build_config(path)
    # Real-model configs name weights resolved at deploy time; only embedded ones must exist here
    # (their loading and planning are covered in tests/test_planner.py).
    if config.target.path.startswith("builtin:"):
        assert config.target.resolved_path.is_dir()
    if config.drafter is not None and config.drafter.path.startswith("builtin:"):
        assert config.drafter.resolved_path.is_dir()


@pytest.mark.parametrize(
    "text,message",
    [
        ("target: {path: x}\nflavour: cuda\n",
         r"field `flavour`: Input should be 'torch', 'engine' or 'trtllm'"),
        ("target: {path: x}\ndrafter: {method: medusa, path: y}\n", r"field `drafter.method`"),
        ("target: {path: x}\ndrafter: {method: draft_model, path: y, num_draft_tokens: 0}\n",
         r"field `drafter.num_draft_tokens`: Input should be greater than or equal to 1, got 0"),
        ("drafter: null\n", r"field `target`: Field required"),
        ("target: {path: x, weights: z}\n", r"field `target.weights`: Extra inputs are not permitted"),
        ("target: [unclosed\n", r"not valid YAML at line"),
        ("- a\n- b\n", r"expected a mapping"),
        ("target: {path: x}\nsampling: {coupling: gumble}\n",
         r"field `sampling.coupling`: Input should be 'rejection' or 'gumbel'"),
        ("target: {path: x}\nflavour: trtllm\nsampling: {coupling: gumbel}\n",
         r"sampling.coupling gumbel needs flavour torch or engine: TensorRT-LLM verifies"),
        # found auditing the CLI (2026-12-03): each of these loaded, and then ...
        # ... the second section silently replaced the first (PyYAML keeps the last key)
        ("target: {path: x}\ndrafter: {method: dflash, path: y}\ndrafter: {method: eagle3, path: z}\n",
         r"not valid YAML at line 3: key 'drafter' given twice \(first at line 2\)"),
        ("target: {path: x, dtype: float32, dtype: bfloat16}\n", r"key 'dtype' given twice"),
        # ... `generate` died of SIGSEGV starting 100,000 OpenMP threads
        ("target: {path: x}\nruntime: {threads: 100000}\n",
         r"field `runtime.threads`: expected 'auto' or an integer in \[1, 1024\], got 100000$"),
        # ... `build` wrote the model into model_repository/ itself, into model_repository/a/b/, or
        # (name: ../../x) outside its output folder
        ("name: ''\ntarget: {path: x}\n", r"field `name`: expected letters, digits"),
        ("name: a/b\ntarget: {path: x}\n", r"field `name`: .* got 'a/b'$"),
        ("name: ../../x\ntarget: {path: x}\n", r"field `name`: .* got '../../x'$"),
        # ... and wrote a Kubernetes Service that `kubectl apply` refuses
        ("name: Qwen3_8B\nflavour: trtllm\ntarget: {path: x}\n",
         r"name 'Qwen3_8B': flavour trtllm names its Kubernetes Service after it"),
        # ... `inspect` was an OverflowError traceback, or ran for hours over 10^8 batch sizes
        ("target: {path: x}\ndeployment: {gpu: H200, model_id: Qwen/Qwen3-8B, runtime_reserve_gib: .inf}\n",
         r"field `deployment.runtime_reserve_gib`: Input should be less than or equal to 1024"),
        ("target: {path: x}\ndeployment: {gpu: H200, model_id: Qwen/Qwen3-8B, max_batch_size: 100000000}\n",
         r"field `deployment.max_batch_size`: Input should be less than or equal to 65536"),
        # ... and Kubernetes manifests whose pods run whatever `:latest` is when they are scheduled
        ("target: {path: x}\ndeployment: {gpu: H200, model_id: Qwen/Qwen3-8B,\n"
         "  image: nvcr.io/nvidia/tensorrt-llm/release}\n",
         r"field `deployment.image`: pin the image to a release tag or digest .* got "
         r"'nvcr.io/nvidia/tensorrt-llm/release'$"),
        ("target: {path: x}\ndeployment: {gpu: H200, model_id: Qwen/Qwen3-8B,\n"
         "  image: 'localhost:5000/trtllm:latest'}\n",
         r"field `deployment.image`: .* got 'localhost:5000/trtllm:latest'$"),
        # ... `build` wrote a deployment whose every request was then refused one by one (2026-12-03)
        ("target: {path: x}\nlimits: {max_tokens: 1000000000000}\n",
         r"field `limits.max_tokens`: Input should be less than or equal to 16777216, got 1000000000000$"),
        ("target: {path: x}\nlimits: {max_input_tokens: 100000000}\n",
         r"field `limits.max_input_tokens`: Input should be less than or equal to 16777216"),
        ("target: {path: x}\nlimits: {prefill_chunk: 100000000}\n",
         r"field `limits.prefill_chunk`: Input should be less than or equal to 16777216"),
        # found fuzzing (2026-12-05): YAML's true read as 1 (a deployment generating one token)
        ("target: {path: x}\nlimits: {max_tokens: true}\n",
         r"field `limits.max_tokens`: expected a number, not a boolean, got True$"),
        ("target: {path: x}\nlimits: {max_input_tokens: false}\n",
         r"field `limits.max_input_tokens`: .* not a boolean"),
        ("target: {path: x}\nruntime: {threads: true}\n", r"field `runtime.threads`: .* got True$"),
        ("target: {path: x}\ndeployment: {gpu: H200, model_id: Qwen/Qwen3-8B, max_batch_size: true}\n",
         r"field `deployment.max_batch_size`: .* not a boolean"),
        # ... a number's boolean check looks into a union's list of numbers too, and leaves a
        # string field's boolean to pydantic's own words
        ("target: {path: x}\ndeployment: {gpu: H200, model_id: Qwen/Qwen3-8B,\n"
         "  acceptance_by_position: true}\n",
         r"field `deployment.acceptance_by_position`: expected a number, not a boolean, got True$"),
        ("target: {path: x}\ndeployment: {gpu: H200, model_id: true}\n",
         r"field `deployment.model_id`: Input should be a valid string, got True$"),
        # a refused value is quoted 3 levels deep, and whole up to 200 characters: 198 d's and their
        # two quotes are 200, with no "…" after them
        ("target: {path: x}\ndeployment: {gpu: H200, model_id: Qwen/Qwen3-8B, max_batch_size: [[[[1]]]]}\n",
         r"field `deployment.max_batch_size`: Input should be a valid integer, got \[\[\[\[\.\.\.\]\]\]\]$"),
        ("target: {path: x}\nlimits: {max_tokens: " + "d" * 198 + "}\n",
         r"field `limits.max_tokens`: Input should be a valid integer, .*, got '" + "d" * 198 + "'$"),
        ("target: {path: x}\nlimits: {stream_interval: 0}\n",
         r"field `limits.stream_interval`: Input should be greater than or equal to 1, got 0$"),
    ],
)
def test_bad_configs(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as info:
        load_build_config(path)
    assert str(path) in str(info.value)


def test_a_value_a_validator_names_is_named_once(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("target: {path: x, device: gpu}\ngpus: [-1]\n")
    with pytest.raises(ConfigError) as info:
        load_build_config(path)
    text = str(info.value)  # was "..., got 'gpu', got 'gpu'"
    assert text.count("got 'gpu'") == 1 and text.count("got [-1]") == 1, text


def test_a_checks_advice_is_given_whole_and_a_value_it_quotes_is_cut(tmp_path):
    """A check's message of more than MAX_SHOWN characters keeps its advice to the end (it was cut at
    200: "... or use an eagle3 dr…"); the values checks quote are cut as pydantic's are."""
    path = tmp_path / "bad.yaml"
    path.write_text("name: trtllm-lookup\ntarget: {path: builtin:tiny-target}\nflavour: trtllm\n"
                    "drafter: {method: draft_model, path: builtin:tiny-draft}\nlookup: {}\n"
                    "deployment: {gpu: H200, model_id: Qwen/Qwen3-8B}\n")
    with pytest.raises(ConfigError) as info:
        load_build_config(path)
    advice = str(info.value).split("field `(top level)`: ")[1]
    assert len(advice) > MAX_SHOWN and advice.endswith("; remove lookup or use an eagle3 drafter"), advice
    path.write_text(f"target: {{path: x, device: {'g' * 5000}}}\nname: {'n' * 5000}\n")
    with pytest.raises(ConfigError) as info:
        load_build_config(path)
    lines = str(info.value).splitlines()
    assert lines[0] == f"{path}: 2 mistakes:" and all(len(line) < 2 * MAX_SHOWN for line in lines[1:])
    assert [line.split("`")[1] for line in lines[1:]] == ["name", "target.device"]
    assert all(line.endswith("nnnnnnnnnnnn'") or line.endswith("gggggggggg'") for line in lines[1:])


@pytest.mark.parametrize("extra", [MAX_MISTAKES, MAX_MISTAKES + 1])
def test_an_error_lists_its_first_mistakes_and_counts_the_rest(tmp_path, extra):
    path = tmp_path / "bad.yaml"
    path.write_text("target: {path: x}\n" + "".join(f"extra_{i}: 1\n" for i in range(extra)))
    with pytest.raises(ConfigError) as info:
        load_build_config(path)
    lines = str(info.value).splitlines()
    assert lines[0] == f"{path}: {extra} mistakes:"
    assert lines[1:MAX_MISTAKES + 1] == [f"  field `extra_{i}`: Extra inputs are not permitted, got 1"
                                         for i in range(MAX_MISTAKES)]
    assert lines[MAX_MISTAKES + 1:] == ([] if extra == MAX_MISTAKES else ["  ... and 1 more"])


def test_each_bounded_field_takes_its_least_and_greatest_value_and_the_defaults_are_documented():
    """Every bound is inclusive: a threshold or gain of exactly 0 or 1, no probes, a one-node tree, a
    one-token lookup (min_match = max_match), the largest pool with max_match at POOL_KEY, one token,
    request and chunk-less prefill, no queue, the least and most request bytes, the last GPU id.
    One past a bound is refused by name. Defaults as the field descriptions and README give them."""
    from trtspec.config import (
        MAX_GPU_ID,
        MAX_THREADS,
        GenerationLimits,
        LookupConfig,
        RuntimeConfig,
        ScheduleConfig,
        TargetConfig,
        TestOnlyConfig,
        TreeConfig,
    )
    from trtspec.spec.lookup import POOL_KEY

    for edge in (0, 1):
        ScheduleConfig(threshold=edge, min_gain=edge)
    ScheduleConfig(probe_every=0)
    TreeConfig(nodes=1, topk=1, depth=1)
    LookupConfig(num_draft_tokens=1, min_match=1, max_match=1)
    LookupConfig(min_match=POOL_KEY, max_match=POOL_KEY, pool_tokens=1 << 22)
    GenerationLimits(max_tokens=1, max_input_tokens=1, max_concurrency=1, max_queued=0, prefill_chunk=0,
                     stream_interval=1, max_request_bytes=1024)
    GenerationLimits(max_request_bytes=2**31)
    TestOnlyConfig(fail_on_max_tokens=1)
    assert [RuntimeConfig(threads=n).threads for n in (1, MAX_THREADS)] == [1, MAX_THREADS]
    assert TargetConfig(path="x", device=f"cuda:{MAX_GPU_ID}").device == f"cuda:{MAX_GPU_ID}"
    needs = {TreeConfig: {"nodes": 8}, TargetConfig: {"path": "x"}}  # their required fields
    for model, field, value in [(ScheduleConfig, "threshold", 1.01), (ScheduleConfig, "min_gain", 1.01),
                                (ScheduleConfig, "probe_every", -1), (TreeConfig, "topk", 0),
                                (LookupConfig, "max_match", 0), (LookupConfig, "pool_tokens", (1 << 22) + 1),
                                (GenerationLimits, "max_request_bytes", 2**31 + 1),
                                (GenerationLimits, "max_queued", -1), (GenerationLimits, "prefill_chunk", -1),
                                (TargetConfig, "device", f"cuda:{MAX_GPU_ID + 1}"),
                                (RuntimeConfig, "threads", MAX_THREADS + 1), (RuntimeConfig, "threads", 0)]:
        with pytest.raises(ValueError, match=field):
            model(**needs.get(model, {}), **{field: value})
    with pytest.raises(ValueError, match="a pool place repeats at least 3 tokens, above lookup.max_match 2"):
        LookupConfig(min_match=1, max_match=POOL_KEY - 1, pool_tokens=64)
    limits, target = GenerationLimits(), TargetConfig(path="x")
    assert (limits.max_request_bytes, limits.prefix_reuse, limits.stream_interval) == (32 * 2**20, True, 1)
    lookup = LookupConfig()
    assert (lookup.num_draft_tokens, lookup.min_match, lookup.max_match, lookup.pool_tokens) == (8, 1, 8, 0)
    assert target.cuda_graphs is True and TestOnlyConfig().biased_acceptance is False


def test_a_requests_positions_are_the_targets_or_its_limits_and_limits_past_them_are_refused():
    """capacity: the target's positions, or max_input_tokens + max_tokens where fewer. check_positions
    refuses a limit the config sets that leaves no position for the rest of a request (one short of
    the positions is taken), never a default."""
    from trtspec.config import GenerationLimits

    assert GenerationLimits().capacity(4096) == 4096
    bounded = GenerationLimits(max_input_tokens=100, max_tokens=28)
    assert (bounded.capacity(4096), bounded.capacity(120)) == (128, 120)
    GenerationLimits().check_positions(1024, "the target's context")  # the default 2048: capped per request
    GenerationLimits(max_tokens=1023, max_input_tokens=1023).check_positions(1024, "the target's context")
    for name in ("max_tokens", "max_input_tokens"):
        with pytest.raises(ConfigError, match=rf"limits.{name} 1024 leaves no room in the target's context "
                                              r"of 1024 positions .*expected \[1, 1023\]"):
            GenerationLimits(**{name: 1024}).check_positions(1024, "the target's context")


def test_the_biased_accept_rule_is_taken_for_flavour_torch_only():
    """The negative control of the sampling-law tests (`test_only.biased_acceptance`) runs in the
    torch flavour's verifier; the others would serve it unbiased, so they refuse it."""
    from trtspec.config import BuildConfig

    def config(flavour: str) -> BuildConfig:
        return BuildConfig.model_validate({"target": {"path": "builtin:tiny-target"}, "flavour": flavour,
                                           "test_only": {"biased_acceptance": True}})

    assert config("torch").test_only.biased_acceptance is True
    for flavour in ("engine", "trtllm"):
        with pytest.raises(ValueError, match=f"biased_acceptance is for flavour torch only, not '{flavour}'"):
            config(flavour)


def test_booleans_stay_booleans_and_numbers_numbers(tmp_path):
    """The check refuses a boolean for a number only: a boolean field takes one, a number field a
    number."""
    path = tmp_path / "ok.yaml"
    path.write_text("target: {path: x}\nlimits: {prefix_reuse: false, max_tokens: 64}\n"
                    "runtime: {threads: 2}\n")
    config = load_build_config(path)
    assert (config.limits.prefix_reuse, config.limits.max_tokens, config.runtime.threads) == (False, 64, 2)


def test_missing_config(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_build_config(tmp_path / "none.yaml")


def test_relative_paths_resolve_against_the_yaml(tmp_path):
    (tmp_path / "sub").mkdir()
    path = tmp_path / "sub" / "c.yaml"
    path.write_text("target: {path: ../models/t}\n")
    assert load_build_config(path).target.resolved_path == tmp_path / "sub" / "../models/t"


def test_yaml_that_expands_or_nests_past_reason_is_refused_in_a_few_lines(tmp_path):
    """Found fuzzing build configs (2026-12-05): 400 bytes of YAML aliases made a 53 MB error (each
    expansion quoted whole); an integer of 5,000 digits and 5,000 nested lists were Python's own
    words without the file; `1:30` (YAML 1.1's base 60) was read as 90."""
    base = (REPO / "build_configs" / "tiny-dflash.yaml").read_text()
    aliases = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    aliases += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 8)]
    cases = {
        "bomb": (base + "\n".join(aliases) + "\ngpus: [*a7, *a7, *a7]\n", "field `gpus.2`"),
        "digits": (base + "runtime: {threads: " + "9" * 5000 + "}\n", "Exceeds the limit (4300 digits)"),
        "deep": (base.replace("path: builtin:tiny-target", "path: " + "[" * 5000 + "]" * 5000),
                 "RecursionError"),
        "base60": (base + "runtime: {threads: 1:30}\n", "field `runtime.threads`"),
    }
    for name, (text, said) in cases.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(text)
        with pytest.raises(ConfigError) as info:
            load_build_config(path)
        message = str(info.value)
        assert message.startswith(f"{path}: ") and said in message, (name, message[:300])
        assert len(message) < 10_000, (name, len(message))  # 53 MB before
    assert "'1:30'" in message  # a string, not 90


def test_gpu_ids_past_any_machine_are_refused_by_field(tmp_path):
    """Found fuzzing build configs (2026-12-05): cuda:99999999999999999999 was torch's parse error
    without the field, gpus: [10**30] passed the config and failed in the Triton config."""
    base = (REPO / "build_configs" / "tiny-dflash.yaml").read_text()
    on_gpu_1024 = base.replace("path: builtin:tiny-target", "path: builtin:tiny-target\n  device: cuda:1024")
    for text, field in ((on_gpu_1024, "field `target.device`: expected cpu, cuda or cuda:N "
                                      "(N in [0, 1023])"),
                        (base + "gpus: [1000000000000000000000000000000]\n", "field `gpus`")):
        path = tmp_path / "c.yaml"
        path.write_text(text)
        with pytest.raises(ConfigError, match=re.escape(field)):
            load_build_config(path)
    path.write_text(base + "gpus: [0, 1023]\n")
    assert load_build_config(path).gpus == [0, 1023]


@pytest.mark.parametrize("field, said", [
    ("target.path", "the path holds a name of 300 bytes, over the 255"),
    ("drafter.path", "the path is 6,005 bytes long, over the 4,095"),
    ("drafter.schedule.sps_table", "the path holds a name of 300 bytes"),
    ("engine.folder", "the path holds a name of 300 bytes"),
])
def test_paths_the_file_system_calls_too_long_are_refused_by_field(tmp_path, field, said):
    """Found fuzzing build configs (2026-12-05): a 6 KB target.path was "File name too long" naming
    neither the field nor the limit."""
    raw = yaml.safe_load((REPO / "build_configs" / "tiny-dflash.yaml").read_text())
    *parents, leaf = field.split(".")
    section = raw
    for name in parents:
        section = section.setdefault(name, {})
    section[leaf] = "/tmp/" + "a" * (6000 if "6,005" in said else 300)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=re.escape(f"field `{field}`: {said}")):
        load_build_config(path)
    section[leaf] = "/tmp/" + "a" * 255  # the longest name a file system takes loads (and is then missing)
    path.write_text(yaml.safe_dump(raw))
    load_build_config(path)


def test_deployment_sizes_past_any_model_are_refused_by_field(tmp_path):
    """Found fuzzing build configs (2026-12-05): deployment.max_seq_len 10**18 planned 0 tokens/s."""
    raw = yaml.safe_load((REPO / "build_configs" / "llama3.1-8b-dflash.yaml").read_text())
    path = tmp_path / "c.yaml"
    for field, value in (("max_seq_len", 10**18), ("max_num_tokens", 2**30)):
        path.write_text(yaml.safe_dump({**raw, "deployment": {**raw["deployment"], field: value}}))
        said = f"field `deployment.{field}`: Input should be less than or equal to 16777216"
        with pytest.raises(ConfigError, match=re.escape(said)):
            load_build_config(path)


def test_the_drafter_method_and_the_deployments_drafter_agree(tmp_path):
    """Found fuzzing build configs (2026-12-05): an eagle3 config over a DFlash drafter_id built a
    TensorRT-LLM deployment of decoding_type Eagle3 pointing at the DFlash weights."""
    from trtspec.plan.models import DRAFTER_METHODS, DRAFTERS

    assert set(DRAFTER_METHODS) == set(DRAFTERS)
    raw = yaml.safe_load((REPO / "build_configs" / "qwen3-8b-dflash-h200.yaml").read_text())
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({**raw, "drafter": {**raw["drafter"], "method": "eagle3"}}))
    with pytest.raises(ConfigError, match="drafter.method eagle3 but deployment.drafter_id "
                                          "z-lab/Qwen3-8B-DFlash-b16 is a dflash drafter"):
        load_build_config(path)
