# syntax=docker/dockerfile:1
# GPU node: a TensorRT-LLM deployment planned by trtspec. At start the entrypoint runs
# `trtspec build` on the build config mounted at /etc/trtspec/build.yaml (memory plan, refusal of
# what cannot fit, draft_len_schedule from the cost model) and execs the generated launch.sh:
# `serve` (trtllm-serve, OpenAI API on deployment.port) or `triton` (tritonserver, llmapi model).
#   docker build -f deploy/docker/gpu.Dockerfile -t trtspec-gpu .      (from the repository root)
#   docker run --gpus all --ipc=host -p 8000:8000 -v /data/models:/models \
#       -v $PWD/build_configs/llama3.1-8b-dflash.yaml:/etc/trtspec/build.yaml:ro trtspec-gpu
# Checkpoints live under /models (deployment.weights_dir). One node; multi-node replicas use the
# LeaderWorkerSet manifests `trtspec build` writes (deploy/k8s.yaml), which run as root for sshd.

# The one place the NVIDIA base image is named: Triton Inference Server with TensorRT-LLM.
ARG TRITON_TRTLLM_IMAGE=nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3
FROM ${TRITON_TRTLLM_IMAGE}

# Refuse a TensorRT-LLM without the fields trtspec writes (trtspec/trtllm/fields.py), or a
# trtllm-serve without the options launch.sh may pass (deployment.reasoning_parser, tool_parser), at
# build time rather than on the first request. The source is read, not imported: no GPU at build time.
RUN set -eu; \
    root="$(python3 -c 'import importlib.util as u; print(u.find_spec("tensorrt_llm").submodule_search_locations[0])')"; \
    args="$root/llmapi/llm_args.py"; \
    for name in "class DFlashDecodingConfig" "class DSparkDecodingConfig" draft_len_schedule \
                acceptance_rate_window_size acceptance_rate_threshold; do \
        grep -q "$name" "$args" || { echo "TensorRT-LLM in this base image lacks $name ($args)"; exit 1; }; \
    done; \
    for flag in --reasoning_parser --tool_parser; do \
        grep -q -- "\"$flag\"" "$root/commands/serve.py" \
            || { echo "trtllm-serve in this base image lacks $flag ($root/commands/serve.py)"; exit 1; }; \
    done

# trtspec in its own venv: its pins (CPU torch, transformers 5) must not touch TensorRT-LLM's
RUN apt-get update && apt-get install -y --no-install-recommends python3-venv \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/trtspec/src
COPY pyproject.toml README.md ./
COPY trtspec ./trtspec
COPY plugins ./plugins
RUN python3 -m venv /opt/trtspec/venv \
    && /opt/trtspec/venv/bin/pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu \
    && /opt/trtspec/venv/bin/pip install --no-cache-dir . \
    && ln -s /opt/trtspec/venv/bin/trtspec /usr/local/bin/trtspec
COPY deploy/docker/gpu-entrypoint.sh deploy/docker/gpu-healthcheck.py /opt/trtspec/

RUN useradd --create-home --uid 10001 trtspec \
    && mkdir -p /models /etc/trtspec /var/lib/trtspec \
    && chown trtspec:trtspec /var/lib/trtspec
USER 10001:10001
ENV TRTSPEC_CONFIG=/etc/trtspec/build.yaml TRTSPEC_OUT=/var/lib/trtspec/build
VOLUME ["/models"]
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=900s --retries=3 \
    CMD ["python3", "/opt/trtspec/gpu-healthcheck.py"]
ENTRYPOINT ["/opt/trtspec/gpu-entrypoint.sh"]
CMD ["serve"]
