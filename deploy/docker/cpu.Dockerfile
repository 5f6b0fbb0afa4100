# syntax=docker/dockerfile:1
# CPU demo: `trtspec serve` of the embedded default (tiny DFlash) built into /models/tiny.
#   docker build -f deploy/docker/cpu.Dockerfile -t trtspec-cpu .      (from the repository root)
#   docker run --rm -p 8000:8000 -p 8001:8001 -p 8002:8002 -p 9000:9000 trtspec-cpu
# Ports: Triton HTTP 8000, gRPC 8001, metrics 8002, OpenAI-compatible API 9000. Serve your own
# build by mounting a `trtspec build` output over /models/tiny (or another folder and a new CMD).
FROM python:3.11.11-slim-bookworm

ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
RUN useradd --create-home --uid 10001 trtspec

WORKDIR /opt/trtspec/src
COPY pyproject.toml README.md ./
COPY trtspec ./trtspec
COPY plugins ./plugins
COPY build_configs/tiny-dflash.yaml ./build_configs/tiny-dflash.yaml
# torch first, from the CPU wheel index: an unpinned torch would pull a multi-GB CUDA build
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu \
    && pip install ".[serve]"

RUN trtspec build build_configs/tiny-dflash.yaml --out /models/tiny \
    && chown -R trtspec:trtspec /models
# No VOLUME over /models: Docker fills a volume from the image only while it is empty, so after a
# rebuild a kept volume would go on serving the repository the first container was built with.
USER 10001:10001
EXPOSE 8000 8001 8002 9000
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/v2/health/ready', timeout=4)"]
CMD ["trtspec", "serve", "/models/tiny", "--host", "0.0.0.0", "--http-port", "8000", "--grpc-port", "8001", "--metrics-port", "8002", "--openai-port", "9000"]
