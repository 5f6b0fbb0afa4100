"""What a CUDA graph would get wrong, found on the CPU: the padded decode steps traced as a capture
and its replays.

A CUDA graph records the kernels of one run of a step, with every pointer and every scalar
argument frozen, and replays exactly that. On a CPU nothing is captured (`GraphedSteps` runs the
padded step eagerly), so a step that would break a capture, or worse, replay something stale, still
decodes correctly here. `CaptureAudit` runs the padded steps the way a graph would see them:

- it traces each run at the ATen level (`TorchDispatchMode`): every op, every scalar argument, and
  for every tensor argument either the address of its storage (a tensor from outside the step:
  weights, K/V buffers, the graph's input buffers) or which tensor of the step made it;
- the first use of a shape runs WARMUP times, then once more as the "capture" (what
  `GraphedSteps._capture` does on CUDA); every later run of the shape is a "replay", and its trace
  must equal the capture's. A scalar that changes between runs (a Python int read from the data)
  or an outside tensor at a new address (made per step, outside the step) would be frozen into the
  graph and replayed stale: the audit names the op and both arguments;
- what a capture refuses is a problem in any run: a read of a value on the host (`.item()`,
  `.tolist()`, `.cpu()`, `bool(tensor)`, `nonzero`, a boolean-mask index: the host waits for the
  device) and a tensor built from host data (`torch.tensor(...)`: a copy from pageable memory). A
  factory that names no device (`torch.arange(n)`) is one too: on a GPU it makes a host tensor;
- a replay returns the capture's output tensors, rewritten in place, after every output of the
  model's other shapes was overwritten with garbage: on CUDA they sit in the graphs' shared memory
  pool, and a later replay may overwrite them. A caller that reads an output after the model's
  next step then decodes garbage here, and the decode tests, which compare tokens, fail.

Use: `with CaptureAudit() as audit: <decode with cuda_graphs on the CPU>`, then `audit.problems`
(empty for a step a graph replays faithfully) and `audit.replays` (how many runs were compared).
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterable

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

WARMUP = 2  # as GraphedSteps: eager runs before the capture

# ops a capture refuses: each makes the host wait for the device's data
HOST_READS = {"_local_scalar_dense", "item", "nonzero", "masked_select", "unique", "_unique", "_unique2",
              "unique_consecutive", "unique_dim", "equal", "is_nonzero", "repeat_interleave"}
HOST_DATA = {"lift_fresh", "lift_fresh_copy"}  # a tensor made from host data (torch.tensor)
HOST_CALLS = {"tolist", "item", "numpy", "cpu", "__int__", "__float__", "__bool__", "__index__", "__array__"}

_CURRENT: contextvars.ContextVar[CaptureAudit | None] = contextvars.ContextVar("trtspec_capture_audit",
                                                                               default=None)

Outputs = tuple[torch.Tensor | None, ...]


def current_audit() -> CaptureAudit | None:
    """The audit of the enclosing `with CaptureAudit()`, if any."""
    return _CURRENT.get()


def _factories() -> set:
    """torch's functions that take a device= (what `with torch.device(...)` fills in); imported
    here, not with this module, which the serving models import on every machine."""
    from torch.utils._device import _device_constructors

    return _device_constructors()


class _HostCalls(TorchFunctionMode):
    """Catches, at the Python level, a factory (torch.zeros, torch.arange, torch.tensor ...) called
    with no device= and a tensor read on the host (`tolist` never reaches the dispatcher, and under
    inference mode `.item()` reaches it as aten.item, not aten._local_scalar_dense)."""

    def __init__(self, refused: list[str]):
        super().__init__()
        self.refused = refused

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if func in _factories() and kwargs.get("device") is None:
            self.refused.append(f"torch.{name} names no device: on a GPU it makes a host tensor")
        elif name in HOST_CALLS:
            self.refused.append(f"Tensor.{name} reads a device value on the host")
        return func(*args, **kwargs)


class _Trace(TorchDispatchMode):
    """One run of a step at the ATen level: (op, argument descriptions) in order, and the ops a
    capture refuses."""

    def __init__(self):
        super().__init__()
        self.ops: list[tuple] = []
        self.refused: list[str] = []
        self._made: dict[int, int] = {}  # storage address -> index of the step's tensor made there

    def _describe(self, x):
        if not isinstance(x, torch.Tensor):
            return x if isinstance(x, (int, float, bool, str, type(None))) else repr(x)
        if x.numel() == 0:
            return ("empty", tuple(x.shape), x.dtype)
        where = x.untyped_storage().data_ptr()
        origin = ("made", self._made[where]) if where in self._made else ("outside", where)
        return (*origin, x.storage_offset(), tuple(x.shape), x.stride(), x.dtype)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if name in HOST_READS and not (name == "repeat_interleave" and kwargs.get("output_size")):
            self.refused.append(f"{func} reads a device value on the host")
        if name in HOST_DATA:
            self.refused.append(f"{func}: a tensor built from host data (torch.tensor) inside the step")
        flat, _ = tree_flatten((args, kwargs))
        if name in ("index", "index_put", "index_put_") and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in tree_flatten(args[1])[0]):
            self.refused.append(f"{func} with a boolean mask (a nonzero: the host reads the mask)")
        self.ops.append((str(func), tuple(self._describe(x) for x in flat)))
        out = func(*args, **kwargs)
        given = {x.untyped_storage().data_ptr() for x in flat if isinstance(x, torch.Tensor)}
        for y in tree_flatten(out)[0]:
            if isinstance(y, torch.Tensor) and y.untyped_storage().data_ptr() not in given:
                self._made[y.untyped_storage().data_ptr()] = len(self.ops) - 1
        return out


def _first_difference(captured: list[tuple], replayed: list[tuple]) -> str:
    for i, (a, b) in enumerate(zip(captured, replayed, strict=False)):
        if a != b:
            if a[0] != b[0]:
                return f"op {i} is {b[0]}, the graph's is {a[0]}"
            j = next(k for k, (x, y) in enumerate(zip(a[1], b[1], strict=False)) if x != y) \
                if len(a[1]) == len(b[1]) else None
            if j is None:
                return f"op {i} {a[0]} takes {len(b[1])} arguments, the graph's {len(a[1])}"
            return f"op {i} {a[0]} argument {j} is {b[1][j]}, frozen in the graph as {a[1][j]}"
    return f"{len(replayed)} ops, the graph has {len(captured)}"


@torch.inference_mode()  # outputs made under inference mode (the models' forwards) are written there
def _poison(outputs: Outputs | None) -> None:
    for y in outputs or ():
        if y is not None:
            y.fill_(float("nan") if y.is_floating_point() else -1)


@torch.inference_mode()
def _rewrite(outputs: Outputs, fresh: Outputs) -> None:
    for y, new in zip(outputs, fresh, strict=True):
        if y is not None:
            y.copy_(new)


class CaptureAudit:
    """Within `with CaptureAudit() as audit:`, every padded step of a model on the CPU runs as a
    CUDA graph's capture and replays would (see the module doc)."""

    def __init__(self):
        self.problems: list[str] = []
        self.captures = 0
        self.replays = 0
        self._graphs: dict[int, tuple[object, list[tuple]]] = {}  # id(graph) -> (graph, its capture)
        self._differed: set[int] = set()  # graphs with a replay named in problems

    def __enter__(self) -> CaptureAudit:
        self._token = _CURRENT.set(self)
        return self

    def __exit__(self, *exc) -> None:
        _CURRENT.reset(self._token)

    def _traced(self, label: str, run: Callable[[], Outputs]) -> tuple[Outputs, _Trace]:
        trace = _Trace()
        with _HostCalls(trace.refused), trace:
            outputs = run()
        for why in dict.fromkeys(trace.refused):
            self._problem(f"{label}: {why}")
        return outputs, trace

    def _problem(self, text: str) -> None:
        if text not in self.problems:
            self.problems.append(text)

    def step(self, label: str, graph: object, outputs: Outputs | None, run: Callable[[], Outputs],
             others: Iterable[Outputs | None]) -> Outputs:
        """Run one padded step of `graph` (the object holding its static buffers) as a capture, the
        first time, or a replay. outputs: what its capture returned (None the first time);
        others: the outputs of the model's other graphs, which a replay may overwrite."""
        if id(graph) not in self._graphs:
            for _ in range(WARMUP):
                self._traced(label, run)
            outputs, trace = self._traced(label, run)
            self._graphs[id(graph)] = (graph, trace.ops)
            self.captures += 1
            return outputs
        for other in others:
            _poison(other)
        fresh, trace = self._traced(label, run)
        captured = self._graphs[id(graph)][1]
        if trace.ops != captured and id(graph) not in self._differed:  # its first differing replay
            self._differed.add(id(graph))
            why = _first_difference(captured, trace.ops)
            self._problem(f"{label}: a replay differs from the capture: {why}")
        _rewrite(outputs, fresh)  # the capture's outputs, as a replay rewrites them
        self.replays += 1
        return outputs
