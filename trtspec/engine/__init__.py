"""Engine flavour: graph sessions (onnxruntime on CPU, TensorRT on GPU), the adapters the
decoder runs over, and the engine build."""
