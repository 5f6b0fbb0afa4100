"""trtspec's two TensorRT plugins, each an OpenAI Triton kernel with a torch reference.

- `plugins.kv_injection_attention`: DFlash/DSpark drafter attention, block queries over
  [context K/V ; block K/V] (GQA, non-causal, RoPE already applied).
- `plugins.confidence_verify`: the accepted/recovered/bonus verifier, greedy or sampling, with
  per-row draft lengths from DSpark's confidence scheduler.

Kernels run on CUDA tensors, or on CPU tensors under the Triton interpreter (`TRITON_INTERPRET=1`
set before the first import of a kernel module). TensorRT registration lives in each
subpackage's `trt_plugin` module, importable only where `tensorrt` is installed.
"""
