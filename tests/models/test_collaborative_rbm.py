"""CollaborativeRBM (seed 003): encodings, factored and conditional weights and their CD
updates (eq. 17-22), and learning on simulated students."""

import pyro
import pytest
import torch
from pyro.infer import SVI
from pyro.optim import Adam

from pyro_seq.data import simulate_students
from pyro_seq.infer import ContrastiveDivergence
from pyro_seq.metrics import capped_binomial_deviance
from pyro_seq.models import CollaborativeRBM


def test_encodings():
    a = torch.tensor([0, 1, 1, 0])
    assert torch.equal(
        CollaborativeRBM(5, visible="bernoulli").encode(a), torch.tensor([0.0, 1, 1, 0])
    )
    four = CollaborativeRBM(5, visible="bernoulli", num_options=4)
    assert torch.equal(four.encode(a), torch.tensor([1.0, 0, 0, 1]))  # option 0 is correct
    soft = CollaborativeRBM(5, visible="binomial_softmax", num_options=4, num_trials=2)
    assert torch.equal(soft.encode(torch.tensor([2])), torch.tensor([[0.0, 0, 2, 0]]))


def test_factored_weights_and_their_gradients():
    torch.manual_seed(0)
    m = CollaborativeRBM(6, num_hidden=4, visible="softmax", num_factors=2, init_scale=0.5)
    assert torch.allclose(m.weights(), torch.einsum("hc,cqk->hqk", m.B, m.A))
    assert torch.equal(m.B.detach(), torch.eye(4, 2))  # the seed's non-square identity
    row, col = torch.tensor([0, 0, 1]), torch.tensor([1, 3, 3])
    ans = torch.tensor([1, 0, 1])
    cd = ContrastiveDivergence(k=1)
    cd.differentiable_loss(m.model, m.guide, row, col, ans, 2).backward()
    # chain rule of W = B A (seed 003 eq. 18-19): dS/dA = B^T dS/dW, dS/dB = sum_k dS/dW^(k) A^(k)T
    W = m.weights().detach().requires_grad_()
    fn = m.distribution(row, col, 2)
    from pyro_seq.distributions import SparseRBM

    d = SparseRBM(W, m.c.detach(), m.b.detach(), row, col, 2, visible="softmax")
    (d.free_energy(m.encode(ans)) - d.free_energy(cd.last_negatives["answers"])).sum().backward()
    assert torch.allclose(m.A.grad, torch.einsum("hc,hqk->cqk", m.B.detach(), W.grad), atol=1e-6)
    assert torch.allclose(m.B.grad, torch.einsum("hqk,cqk->hc", W.grad, m.A.detach()), atol=1e-6)
    assert fn.batch_shape == (2,)


def test_conditional_update_is_eq_22():
    torch.manual_seed(1)
    m = CollaborativeRBM(5, num_hidden=3, conditional=True, init_scale=0.5).double()
    row, col = torch.tensor([0, 0, 1, 1]), torch.tensor([0, 2, 1, 4])
    ans = torch.tensor([1, 0, 1, 1])
    seen = (torch.tensor([0, 0, 0, 1, 1]), torch.tensor([0, 2, 3, 1, 4]))
    cd = ContrastiveDivergence(k=1)
    cd.differentiable_loss(m.model, m.guide, row, col, ans, 2, seen=seen).backward()
    fn = m.distribution(row, col, 2, seen)
    hp = fn.hidden_probs(m.encode(ans)).detach()
    hn = fn.hidden_probs(cd.last_negatives["answers"]).detach()
    r = torch.zeros(2, 5, dtype=torch.float64)
    r[seen] = 1.0
    delta_D = (hp - hn).T @ r  # eq. 22: (E_data[h_j] - E_model[h_j]) r_i, summed over students
    assert torch.allclose(m.D.grad, -delta_D, atol=1e-12)
    with pytest.raises(ValueError, match="seen"):
        m.distribution(row, col, 2)


@pytest.mark.parametrize("visible", ["bernoulli", "softmax", "binomial_softmax"])
def test_learns_better_than_chance_on_simulated_students(visible):
    data = simulate_students(num_students=600, num_questions=60, observed_fraction=0.3, seed=3)
    pyro.clear_param_store()
    torch.manual_seed(0)
    m = CollaborativeRBM(60, num_hidden=5, visible=visible, init_scale=0.01)
    svi = SVI(m.model, m.guide, Adam({"lr": 0.01}), ContrastiveDivergence(k=1))
    for epoch in range(15):
        for b in data.batches(100, seed=epoch):
            svi.step(b.row, b.question, b.answer, b.student.shape[0], data.num_students)
    tr, te = data.train, data.test
    p = m.predict(tr.student, tr.question, tr.answer, data.num_students, te.student, te.question)
    cbd = float(capped_binomial_deviance(p, te.correct))
    floor = float(
        capped_binomial_deviance(data.true_probability(te.student, te.question), te.correct)
    )
    assert floor < cbd < 0.30103 - 0.02


def test_validation():
    with pytest.raises(ValueError, match="visible"):
        CollaborativeRBM(5, visible="gauss")
    with pytest.raises(ValueError, match="num_options"):
        CollaborativeRBM(5, num_options=3)
    with pytest.raises(ValueError, match="num_factors"):
        CollaborativeRBM(5, num_factors=0)
