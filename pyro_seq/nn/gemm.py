"""The matrix products inside the package's hand-written scans, on the faster CPU library.

torch's CPU matrix product for float32 calls MKL's sgemm. On CPUs where MKL does not take its
fastest code path (measured on the 2-core AMD EPYC machine with AVX-512 of the benchmarks:
about 100 GFLOP/s for a large product, against about 200 for oneDNN's, the library behind
torch's fused LSTM), oneDNN's inner-product primitive computes the same product 1.4-2.2 times
as fast for the shapes of the recurrent scans, ``(5..20, 600) x (600, 600)``, ``(16, 300) x
(300, 900)`` and the large weight-gradient products, and is slower below about 1.5 million
multiply-adds (its fixed cost). :func:`linear` routes a product to oneDNN where all of these
hold, and to ``torch.addmm`` / ``torch.mm`` otherwise:

* float32 on the CPU, 2-d operands, no autograd (inside a scan's own forward or backward);
* at least :data:`MIN_MULTIPLY_ADDS` multiply-adds;
* torch has oneDNN (``torch.backends.mkldnn``) enabled, and its ``mkldnn._linear_pointwise``
  operator ran correctly on a probe the first time it was asked for (otherwise never).

The two libraries round differently (sums in another order): results agree to float32
rounding, not bit for bit. float64 always takes ``torch.addmm`` (the tests' reference paths).
"""

from typing import Optional

import torch
from torch import Tensor

__all__ = ["MIN_MULTIPLY_ADDS", "addmm", "linear", "matmul", "onednn_available"]

#: Products with fewer multiply-adds (n k m) stay on ``torch.addmm``.
MIN_MULTIPLY_ADDS = 1_500_000

_ONEDNN: Optional[bool] = None


def onednn_available() -> bool:
    """Whether :func:`linear` may use oneDNN: torch's oneDNN backend is enabled and its fp32
    ``linear`` operator gives ``x W^T + b`` on a probe (checked once per process)."""
    global _ONEDNN
    if not (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled):
        return False
    if _ONEDNN is None:
        try:
            op = torch.ops.mkldnn._linear_pointwise
            gen = torch.Generator().manual_seed(0)
            x, w, b = (torch.randn(s, generator=gen) for s in ((3, 5), (4, 5), (4,)))
            with torch.no_grad():
                got = op(x, w, b, "none", [], "")
            _ONEDNN = bool(torch.allclose(got, torch.addmm(b, x, w.t()), atol=1e-5))
        except (AttributeError, RuntimeError, TypeError):
            _ONEDNN = False
    return _ONEDNN


def _routed(x: Tensor, n: int, k: int, m: int) -> bool:
    return (
        x.dtype == torch.float32
        and x.device.type == "cpu"
        and n * k * m >= MIN_MULTIPLY_ADDS
        and not torch.is_grad_enabled()
        and onednn_available()
    )


def _onednn(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    return torch.ops.mkldnn._linear_pointwise(
        x.contiguous(), weight.contiguous(), bias, "none", [], ""
    )


def linear(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """``x W^T + b``: ``x (n, k)``, ``weight (m, k)``, ``bias (m,)`` or None -> ``(n, m)``, on
    oneDNN where the module docstring's conditions hold, else ``torch.addmm`` / ``torch.mm``."""
    n, k = x.shape
    if _routed(x, n, k, weight.shape[0]):
        return _onednn(x, weight, bias)
    if bias is None:
        return torch.mm(x, weight.t())
    return torch.addmm(bias, x, weight.t())


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` for 2-d ``a (n, k)``, ``b (k, m)``, routed as :func:`linear` (oneDNN wants
    both operands row-major: transposed views are copied first)."""
    n, k = a.shape
    if _routed(a, n, k, b.shape[1]):
        return _onednn(a, b.t())
    return torch.mm(a, b)


def addmm(acc: Tensor, x: Tensor, weight: Tensor, out: Optional[Tensor] = None) -> Tensor:
    """``acc + x W^T`` (``acc (n, m)`` per row, unlike a bias), into ``out`` when given,
    routed as :func:`linear`."""
    n, k = x.shape
    if _routed(x, n, k, weight.shape[0]):
        return torch.add(acc, _onednn(x, weight), out=out)
    if out is None:
        return torch.addmm(acc, x, weight.t())
    return torch.addmm(acc, x, weight.t(), out=out)
