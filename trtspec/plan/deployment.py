"""`deployment:` section of a build config: hardware, parallelism, limits and KV-cache policy.

Enough to plan memory and generate TensorRT-LLM / Kubernetes artifacts without the weights: the
architecture comes from `model_id` / `drafter_id` (trtspec/plan/models.py), the weights are
resolved on the serving nodes under `weights_dir`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from trtspec.plan.gpus import GPUS
from trtspec.plan.models import DRAFTERS, TARGETS
from trtspec.strict import StrictModel

# Triton Inference Server with TensorRT-LLM: trtllm-serve and tritonserver, the two servers the
# generated launch.sh runs. The same tag as deploy/docker/gpu.Dockerfile's TRITON_TRTLLM_IMAGE,
# whose build greps its TensorRT-LLM for the fields trtspec writes (tests/test_deploy.py keeps the
# two equal).
TRITON_TRTLLM_IMAGE = "nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3"
MAX_POSITIONS = 1 << 24  # 16,777,216: past any model's context (a max_seq_len of 10**18 planned 0 tokens/s)


class DeploymentConfig(StrictModel):
    """Where and how a model is served; TensorRT-LLM parallelism names in comments."""

    gpu: str = Field(description=f"GPU type: one of {', '.join(GPUS)}")
    nodes: int = Field(1, ge=1, description="nodes serving one replica (multi-node when > 1)")
    gpus_per_node: int = Field(8, ge=1, le=8, description="GPUs used per node by one replica")
    replicas: int = Field(1, ge=1, description="independent copies of the deployment (Kubernetes)")
    tensor_parallel_size: int = Field(1, ge=1, description="TP size (LLM-API tensor_parallel_size)")
    pipeline_parallel_size: int = Field(1, ge=1, description="PP size (LLM-API pipeline_parallel_size)")
    moe_expert_parallel_size: int = Field(
        1, ge=1, description="EP size inside the TP group (LLM-API moe_expert_parallel_size); MoE only"
    )
    model_id: str = Field(description="target architecture to plan with, e.g. Qwen/Qwen3-8B")
    drafter_id: str | None = Field(
        None, description="drafter architecture to plan with; omit without drafter"
    )
    weights_dir: str = Field("/models", description="folder on the serving nodes that holds the checkpoints")
    max_batch_size: int = Field(64, ge=1, le=65536,
                                description="most requests scheduled together (max_batch_size); the "
                                            "planner prices every batch size up to it")
    max_seq_len: int = Field(8192, ge=16, le=MAX_POSITIONS,
                             description="prompt + output tokens per request (max_seq_len)")
    max_num_tokens: int = Field(
        8192, ge=1, le=MAX_POSITIONS, description="tokens per forward across the batch (max_num_tokens)"
    )
    free_gpu_memory_fraction: float = Field(
        0.9, gt=0, le=1, description="share of memory left after weights given to the KV cache"
    )
    kv_cache_dtype: Literal["auto", "fp8"] = Field(
        "auto", description="KV cache dtype (kv_cache_config.dtype)"
    )
    enable_block_reuse: bool = Field(True, description="prefix (block) reuse in the KV cache")
    runtime_reserve_gib: float = Field(
        5.0, ge=0, le=1024, description="per-GPU memory kept for CUDA context, activations and CUDA graphs"
    )
    min_concurrency: int = Field(
        1,
        ge=1,
        le=65536,
        description="full-length (max_seq_len) requests that must fit in KV at once, or build refuses",
    )
    image: str = Field(
        TRITON_TRTLLM_IMAGE,
        description="container image the Kubernetes pods run: it must hold the trtllm-serve (and, for "
        "`launch.sh triton`, the tritonserver) whose TensorRT-LLM has the fields trtspec writes "
        "(trtspec/trtllm/fields.py); pinned by tag or digest, never `:latest`. Default: the Triton + "
        "TensorRT-LLM release deploy/docker/gpu.Dockerfile builds on",
    )
    port: int = Field(8000, ge=1, le=65535, description="HTTP port of the server")
    reasoning_parser: str | None = Field(
        None, pattern=r"^[A-Za-z0-9_.-]+$",
        description="trtllm-serve --reasoning_parser: gives a thinking model's <think> block as the OpenAI "
        "answer's reasoning_content (qwen3, deepseek-r1, ...; the choices of the image's trtllm-serve, "
        "which refuses others at start); `trtspec serve --reasoning-parser` is the same for trtspec's server",
    )
    tool_parser: str | None = Field(
        None, pattern=r"^[A-Za-z0-9_.-]+$",
        description="trtllm-serve --tool_parser: finds tool calls in the model's text under tool_choice auto "
        "(qwen3, <tool_call>{...}</tool_call>, as `trtspec serve --tool-call-parser hermes`; qwen3_coder, "
        "kimi_k2, ...; the choices of the image's trtllm-serve)",
    )
    mean_context_len: int | None = Field(
        None, ge=1, description="context tokens of a running request in the speculation cost model "
        "(trtspec/plan/roofline.py); default max_seq_len / 4"
    )
    acceptance_by_position: list[float] | None = Field(
        None, min_length=1, description="the drafter's conditional acceptance c_1..c_k (P(draft j accepted | "
        "drafts before it were)) for the cost model; default: acceptance.json beside the drafter, else "
        "the method's published default (trtspec/plan/speculation.py)"
    )
    acceptance_rate_window_size: int = Field(
        256, ge=1, description="TensorRT-LLM acceptance_rate_window_size: speculation-enabled iterations "
        "whose rolling acceptance rate is compared with the computed acceptance_rate_threshold"
    )

    @field_validator("acceptance_by_position")
    @classmethod
    def _rates(cls, value: list[float] | None) -> list[float] | None:
        if value is not None and not all(0 <= r <= 1 for r in value):
            raise ValueError(f"rates must lie in [0, 1], got {value}")
        return value

    @model_validator(mode="after")
    def _context_in_sequence(self) -> DeploymentConfig:
        # longer than any request may run: inspect planned 0 tokens/s at every batch size, with no word why
        if self.mean_context_len is not None and self.mean_context_len > self.max_seq_len:
            raise ValueError(f"mean_context_len {self.mean_context_len} is longer than max_seq_len "
                             f"{self.max_seq_len}, the most tokens a request holds")
        return self

    @field_validator("image")
    @classmethod
    def _pinned(cls, value: str) -> str:
        # a tag is what follows the last ':' after the last '/' (a registry's port comes before it)
        name, _, digest = value.partition("@")
        tag = name.rsplit("/", 1)[-1].partition(":")[2]
        if not digest and tag in ("", "latest"):
            raise ValueError(f"pin the image to a release tag or digest (what `:latest` points at changes "
                             f"under a running deployment), got {value!r}")
        return value

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, value: str) -> str:
        if value not in GPUS:
            raise ValueError(f"expected one of {', '.join(GPUS)}")  # the error adds ", got 'A100'"
        return value

    @field_validator("model_id")
    @classmethod
    def _known_target(cls, value: str) -> str:
        """Refused here, naming the file and field (build and inspect refused it only when planning,
        exit 1, naming neither)."""
        if value not in TARGETS:
            raise ValueError(f"expected one of {', '.join(TARGETS)}")
        return value

    @field_validator("drafter_id")
    @classmethod
    def _known_drafter(cls, value: str | None) -> str | None:
        if value is not None and value not in DRAFTERS:
            raise ValueError(f"expected one of {', '.join(DRAFTERS)}")
        return value

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def context_len(self) -> int:
        return self.mean_context_len or max(1, self.max_seq_len // 4)
