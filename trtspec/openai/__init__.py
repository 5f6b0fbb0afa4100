"""OpenAI-compatible API: a frontend beside Triton (`trtspec serve --openai-port`) and a client that
reaches any OpenAI-compatible server (trtspec, trtllm-serve, vLLM, SGLang)."""
