"""SparseRBM: every row is the dense RBM with visible_mask at its entries (seed 003 sec. 2.1)."""

import pytest
import torch

from pyro_seq.distributions import RBM, SparseRBM
from pyro_seq.infer import ContrastiveDivergence
from tests.distributions.test_rbm import _brute_force_log_z

D = torch.float64


def _case(visible="bernoulli", K=None, n_trials=1, seed=0, rows=4, Q=7, H=3):
    g = torch.Generator().manual_seed(seed)
    unit = () if K is None else (K,)
    W = torch.randn((H, Q) + unit, generator=g, dtype=D)
    c = torch.randn((Q,) + unit, generator=g, dtype=D)
    b = torch.randn(H, generator=g, dtype=D)
    present = torch.rand(rows, Q, generator=g) < 0.5
    present[:, 0] = True
    row, column = present.nonzero(as_tuple=True)
    if K is None:
        values = (torch.rand(row.shape[0], generator=g) < 0.5).to(D)
    else:
        idx = torch.randint(K, (row.shape[0],), generator=g)
        values = n_trials * torch.nn.functional.one_hot(idx, K).to(D)
    dense = torch.zeros((rows, Q) + unit, dtype=D)
    dense[row, column] = values
    sparse = SparseRBM(W, c, b, row, column, rows, visible=visible, num_trials=n_trials)
    masked = RBM(W, c, b, visible=visible, num_trials=n_trials, visible_mask=present)
    return sparse, masked, values, dense, present


@pytest.mark.parametrize(
    "visible,K,n", [("bernoulli", None, 1), ("softmax", 3, 1), ("binomial_softmax", 3, 2)]
)
def test_rows_are_the_masked_dense_rbms(visible, K, n):
    sparse, masked, values, dense, present = _case(visible, K, n)
    assert torch.allclose(sparse.free_energy(values), masked.free_energy(dense), atol=1e-12)
    assert torch.allclose(sparse.log_partition(), masked.log_partition("hidden"), atol=1e-10)
    assert torch.allclose(sparse.hidden_probs(values), masked.hidden_probs(dense), atol=1e-12)
    assert torch.allclose(
        sparse.reconstruction_error(values), masked.reconstruction_error(dense), atol=1e-12
    )
    # prediction at every (row, question): the dense mean-field pass
    rows, Q = present.shape
    qr, qc = torch.meshgrid(torch.arange(rows), torch.arange(Q), indexing="ij")
    pred = sparse.predict(values, qr.reshape(-1), qc.reshape(-1))
    full = RBM(masked.W, masked.visible_bias, masked.hidden_bias, visible=visible, num_trials=n)
    expected = full.visible_probs(masked.hidden_probs(dense))
    assert torch.allclose(pred.reshape(expected.shape), expected, atol=1e-12)


@pytest.mark.parametrize("visible,K,n", [("bernoulli", None, 1), ("binomial_softmax", 3, 2)])
def test_log_partition_by_brute_force_over_each_rows_entries(visible, K, n):
    """Each row's log Z sums exp(-E) over its own entries' states only (the last row has none:
    log Z = sum_j softplus(b_j)), with conditional hidden biases per row."""
    g = torch.Generator().manual_seed(4)
    Q, H, rows = 4, 3, 4
    unit = () if K is None else (K,)
    W = torch.randn((H, Q) + unit, generator=g, dtype=D)
    c = torch.randn((Q,) + unit, generator=g, dtype=D)
    b = torch.randn(rows, H, generator=g, dtype=D)
    present = torch.tensor(
        [
            [True, False, True, False],
            [False, True, True, True],
            [True, True, False, False],
            [False, False, False, False],
        ]
    )
    row, column = present.nonzero(as_tuple=True)
    d = SparseRBM(W, c, b, row, column, rows, visible=visible, num_trials=n)
    expected = torch.stack(
        [_brute_force_log_z(W, c, b[s], present[s], visible, n) for s in range(rows)]
    )
    assert torch.allclose(d.log_partition(), expected, atol=1e-10, rtol=0)
    assert torch.allclose(expected[-1], torch.nn.functional.softplus(b[-1]).sum(), atol=1e-12)


def test_pseudo_likelihood_and_gibbs_shapes():
    sparse, masked, values, dense, present = _case()
    assert torch.allclose(
        sparse.pseudo_log_likelihood(values), masked.pseudo_log_likelihood(dense), atol=1e-12
    )
    neg = sparse.gibbs(values, 3)
    assert neg.shape == values.shape and set(neg.unique().tolist()) <= {0.0, 1.0}


def test_cd_gradient_equals_the_dense_masked_gradient_with_the_same_negatives():
    import pyro

    sparse, masked, values, dense, present = _case(seed=2)
    W = sparse.W.clone().requires_grad_()

    def model(v):
        with pyro.plate("rows", 4):
            pyro.sample(
                "x",
                SparseRBM(W, sparse.visible_bias, sparse.hidden_bias, sparse.row, sparse.column, 4),
                obs=v,
            )

    cd = ContrastiveDivergence(k=1)
    cd.differentiable_loss(model, lambda v: None, values).backward()
    neg = torch.zeros_like(dense)
    neg[sparse.row, sparse.column] = cd.last_negatives["x"]
    W2 = sparse.W.clone().requires_grad_()
    d = RBM(W2, masked.visible_bias, masked.hidden_bias, visible_mask=present)
    (d.free_energy(dense) - d.free_energy(neg)).sum().backward()
    assert torch.allclose(W.grad, W2.grad, atol=1e-12)


def test_no_dense_rows_by_items_tensor():
    """A million questions and a thousand rows (10^9 dense cells) with 2000 entries."""
    g = torch.Generator().manual_seed(0)
    Q, rows, H = 1_000_000, 1000, 4
    W = 0.01 * torch.randn(H, Q, generator=g)
    row = torch.randint(rows, (2000,), generator=g)
    column = torch.randint(Q, (2000,), generator=g)
    d = SparseRBM(W, torch.zeros(Q), torch.zeros(H), row, column, rows)
    v = (torch.rand(2000, generator=g) < 0.5).float()
    assert d.free_energy(v).shape == (rows,)
    assert d.gibbs(v, 2).shape == (2000,)


def test_validation():
    W = torch.randn(3, 5)
    row, col = torch.tensor([0, 1]), torch.tensor([2, 4])
    with pytest.raises(ValueError, match="column indices"):
        SparseRBM(W, torch.zeros(5), torch.zeros(3), row, torch.tensor([2, 5]), 2)
    with pytest.raises(ValueError, match="row indices"):
        SparseRBM(W, torch.zeros(5), torch.zeros(3), torch.tensor([0, 2]), col, 2)
    with pytest.raises(ValueError, match="int64"):
        SparseRBM(W, torch.zeros(5), torch.zeros(3), row.float(), col, 2)
    with pytest.raises(ValueError, match="hidden_bias"):
        SparseRBM(W, torch.zeros(5), torch.zeros(3, 3), row, col, 2)
    d = SparseRBM(W, torch.zeros(5), torch.zeros(3), row, col, 2, validate_args=True)
    with pytest.raises(ValueError, match="shape"):
        d.log_prob(torch.zeros(3))
    with pytest.raises(ValueError, match="support"):
        d.log_prob(torch.tensor([0.5, 1.0]))
    with pytest.raises(ValueError, match="expanded"):
        d.expand((3,))
