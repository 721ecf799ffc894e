"""The AE-RNN imputation baseline: its loss (eq. 1) and its forward imputation, by hand."""

import pytest
import torch

from pyro_seq.baselines import AERNN


def _bce(logits, x):
    p = torch.sigmoid(logits)
    return -(x * p.log() + (1 - x) * (1 - p).log()).sum(-1)


@pytest.mark.parametrize("encoder", ["conv", "mlp"])
def test_loss_is_reconstruction_plus_prediction(encoder):
    torch.manual_seed(0)
    m = AERNN(
        (8, 8), code_dim=2, lstm_dim=3, encoder=encoder, channels=4, conv_layers=2, hidden_dims=(5,)
    ).double()
    x = (torch.rand(2, 4, 64) < 0.3).double()
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)
    total, count = 0.0, 0
    for b in range(2):
        prev, hidden = m.c0, None
        for t in range(int(mask[b].sum())):
            out, hidden = m.lstm(prev.view(1, 1, -1), hidden)
            pred = m.predict(out[0, 0])
            code = m.encoder(x[b, t])
            total = total + _bce(m.decoder(code), x[b, t]) + _bce(m.decoder(pred), x[b, t])
            count += 1
            prev = code
    assert torch.allclose(m.loss(x, mask), total / count, rtol=1e-10)


def test_imputation_feeds_predictions_at_missing_steps():
    torch.manual_seed(1)
    m = AERNN((8, 8), code_dim=2, lstm_dim=3, encoder="mlp", hidden_dims=(5,)).double()
    x = (torch.rand(1, 5, 64) < 0.3).double()
    observed = torch.tensor([[True, True, False, False, True]])
    probs, codes = m.impute_frames(x, observed)
    prev, hidden = m.c0, None
    for t in range(5):
        out, hidden = m.lstm(prev.view(1, 1, -1), hidden)
        prev = m.encoder(x[0, t]) if observed[0, t] else m.predict(out[0, 0])
        assert torch.allclose(codes[0, t], prev, atol=1e-12)
        assert torch.allclose(probs[0, t], torch.sigmoid(m.decoder(prev)), atol=1e-12)
    all_seen, _ = m.impute_frames(x, torch.ones(1, 5, dtype=torch.bool))
    assert torch.allclose(all_seen, torch.sigmoid(m.decoder(m.encoder(x))), atol=1e-12)
    with pytest.raises(ValueError):
        AERNN((8, 8), encoder="rnn")
