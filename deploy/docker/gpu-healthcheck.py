"""HEALTHCHECK of deploy/docker/gpu.Dockerfile: healthy when trtllm-serve (`/health`) or tritonserver
(`/v2/health/ready`) answers 200 on $TRTSPEC_HEALTH_PORT (default 8000, deployment.port)."""

import os
import sys
import urllib.request

port = os.environ.get("TRTSPEC_HEALTH_PORT", "8000")
for path in ("/health", "/v2/health/ready"):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=4) as response:
            if response.status == 200:
                sys.exit(0)
    except OSError:
        pass
sys.exit(1)
