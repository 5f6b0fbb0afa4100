"""`trtspec::kv_injection_attention`: Triton kernel, torch reference; TensorRT glue in trt_plugin."""

from plugins.kv_injection_attention.kernel import kv_injection_attention, kv_injection_attention_concat
from plugins.kv_injection_attention.reference import kv_injection_attention_reference

__all__ = ["kv_injection_attention", "kv_injection_attention_concat", "kv_injection_attention_reference"]
