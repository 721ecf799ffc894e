r"""AE-RNN: a deterministic auto-encoder per frame with an LSTM on its codes, the imputation
baseline of the KVAE (thesis 6.5.1, Fig. 6.3).

Each frame is encoded into a code ``c_t = f(x_t)`` by the same convolutional encoder as the
KVAE's (:class:`~pyro_seq.nn.ConvEncoder` and a linear map; MLP for other frame sizes) and
decoded by the same sub-pixel decoder ``g``; an LSTM over ``c_{0:t-1}`` (``c_0`` learned)
predicts the next code ``c_hat_t = W h_t + b``. Training minimises, per frame,

.. math::

    \ell_t = \mathrm{BCE}(g(c_t), x_t) + \mathrm{BCE}(g(\hat c_t), x_t),                 (1)

reconstruction plus next-frame prediction through the code (summed over pixels), so that the
predicted codes decode to frames. Imputation runs the LSTM forward: an observed frame feeds its
own code, a missing one the prediction ``c_hat_t`` (the recursion the KVAE's filter uses, with
a point estimate and no smoothing; an RNN cannot use the future frames).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from pyro_seq.nn.conv import frame_networks

__all__ = ["AERNN"]


class AERNN(nn.Module):
    """Auto-encoder + LSTM baseline (module docstring, eq. 1).

    :param tuple image_shape: ``(H, W)`` of the frames, which travel flattened ``(..., H*W)``.
    :param int code_dim: size of the codes (2, as the KVAE's ``a_t``).
    :param int lstm_dim: LSTM units (50).
    :param str encoder: ``"conv"`` (the KVAE's) or ``"mlp"``.
    :param int channels: filters per convolution (32); ``conv_layers``: 3.
    :param tuple hidden_dims: layers of the MLP encoder/decoder.
    """

    def __init__(
        self,
        image_shape=(32, 32),
        code_dim=2,
        lstm_dim=50,
        encoder="conv",
        channels=32,
        conv_layers=3,
        hidden_dims=(128, 128),
    ):
        super().__init__()
        self.image_shape = tuple(image_shape)
        D = 1
        for s in self.image_shape:
            D *= s
        self.obs_dim = D
        body, features, decoder = frame_networks(
            encoder, self.image_shape, code_dim, channels, conv_layers, hidden_dims
        )
        self.encoder = nn.Sequential(body, nn.Linear(features, code_dim))
        self.decoder = decoder  # after the encoder: the parameter order optimizer states keep
        self.lstm = nn.LSTM(code_dim, lstm_dim, batch_first=True)
        self.predict = nn.Linear(lstm_dim, code_dim)
        self.c0 = nn.Parameter(torch.zeros(code_dim))

    def loss(self, x, mask=None):
        """Mean over real frames of eq. (1): ``x (batch, T, H*W)`` 0/1, ``mask (batch, T)``."""
        B, T, _ = x.shape
        codes = self.encoder(x)
        prev = torch.cat([self.c0.expand(B, 1, -1), codes[:, :-1]], 1)
        h, _ = self.lstm(prev)
        pred = self.predict(h)
        logits = self.decoder(torch.stack([codes, pred]))  # (2, B, T, D)
        per_frame = F.binary_cross_entropy_with_logits(
            logits, x.expand_as(logits), reduction="none"
        ).sum((0, -1))
        if mask is None:
            return per_frame.mean()
        mask = mask.to(per_frame.dtype)
        return (per_frame * mask).sum() / mask.sum()

    @torch.no_grad()
    def impute_frames(self, x, observed_steps):
        """Forward imputation: pixel probabilities ``(batch, T, H*W)`` and codes ``(batch, T,
        code_dim)``; observed steps use their own code, missing ones the LSTM's prediction."""
        B, T, _ = x.shape
        codes = self.encoder(x)
        prev, hidden, used = self.c0.expand(B, -1), None, []
        for t in range(T):
            out, hidden = self.lstm(prev.unsqueeze(1), hidden)
            pred = self.predict(out[:, 0])
            prev = torch.where(observed_steps[:, t, None], codes[:, t], pred)
            used.append(prev)
        used = torch.stack(used, 1)
        return torch.sigmoid(self.decoder(used)), used
