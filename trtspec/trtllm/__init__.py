"""TensorRT-LLM flavour: LLM-API args, Triton llmapi repository, drafter conversion, launchers."""
