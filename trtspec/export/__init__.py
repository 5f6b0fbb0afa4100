"""ONNX export of the target (KV cache, taps), the DFlash drafter (plugin nodes) and greedy verification."""
