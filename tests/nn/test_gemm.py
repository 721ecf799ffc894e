"""``pyro_seq.nn.gemm``: the scans' matrix products, on oneDNN where that is faster. Each helper
must equal its torch formula: bit for bit where it falls back to torch (float64, small
products, autograd on, oneDNN off or broken), to float32 rounding where it routes."""

import contextlib

import pytest
import torch

import pyro_seq.nn.gemm as gemm

ROUTED = (16, 300, 900)  # n, k, m: 4.3 million multiply-adds


def _operands(n, k, m, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, k, generator=gen, dtype=dtype)
    w = torch.randn(m, k, generator=gen, dtype=dtype)
    b = torch.randn(m, generator=gen, dtype=dtype)
    acc = torch.randn(n, m, generator=gen, dtype=dtype)
    return x, w, b, acc


def _all_three(x, w, b, acc):
    with torch.no_grad():
        return (
            (gemm.linear(x, w, b), torch.addmm(b, x, w.t())),
            (gemm.linear(x, w), x @ w.t()),
            (gemm.matmul(x, w.t()), x @ w.t()),
            (gemm.addmm(acc, x, w), acc + x @ w.t()),
        )


def test_routed_products_equal_torch_to_float32_rounding():
    if not gemm.onednn_available():
        pytest.skip("torch has no working oneDNN here: every product falls back to torch")
    x, w, b, acc = _operands(*ROUTED)
    for got, want in _all_three(x, w, b, acc):
        assert got.shape == want.shape and got.dtype == torch.float32
        # sums of 300 products in another order: float32 rounding, relative to the terms
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-4)
    # the output buffer of addmm
    out = torch.empty(ROUTED[0], ROUTED[2])
    with torch.no_grad():
        got = gemm.addmm(acc, x, w, out=out)
    assert got.data_ptr() == out.data_ptr()
    # transposed (non-contiguous) operands
    with torch.no_grad():
        got = gemm.matmul(x.t().contiguous().t(), w.t())
    assert torch.allclose(got, x @ w.t(), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(
    "case", ["float64", "small", "grad_enabled", "onednn_disabled", "onednn_broken"]
)
def test_fallbacks_are_torch_bit_for_bit(case, monkeypatch):
    shape = (4, 5, 6) if case == "small" else ROUTED
    dtype = torch.float64 if case == "float64" else torch.float32
    x, w, b, acc = _operands(*shape, dtype=dtype)
    if case == "onednn_broken":

        def broken(*args):
            raise RuntimeError("no oneDNN here")

        monkeypatch.setattr(gemm, "_ONEDNN", None)
        monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", broken, raising=False)
        assert not gemm.onednn_available()
    flags = (
        torch.backends.mkldnn.flags(enabled=False)
        if case == "onednn_disabled"
        else contextlib.nullcontext()
    )
    with flags:
        if case == "grad_enabled":
            with torch.enable_grad():
                pairs = [
                    (gemm.linear(x, w, b), torch.addmm(b, x, w.t())),
                    (gemm.matmul(x, w.t()), x @ w.t()),
                    (gemm.addmm(acc, x, w), torch.addmm(acc, x, w.t())),
                ]
        else:
            with torch.no_grad():
                pairs = [
                    (gemm.linear(x, w, b), torch.addmm(b, x, w.t())),
                    (gemm.linear(x, w), torch.mm(x, w.t())),
                    (gemm.matmul(x, w.t()), torch.mm(x, w.t())),
                    (gemm.addmm(acc, x, w), torch.addmm(acc, x, w.t())),
                ]
    for got, want in pairs:
        assert torch.equal(got, want)
