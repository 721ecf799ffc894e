"""Convolutional frame encoder and sub-pixel decoder of the KVAE (thesis appendix 6.8).

* :class:`ConvEncoder`: ``layers`` convolutions of ``channels`` filters, kernel 3x3, stride 2,
  padding 1, ReLU; the feature map is flattened (``out_dim = channels * H/2^layers *
  W/2^layers`` features; a distribution head follows). A 32x32 frame becomes 16x16, 8x8, 4x4
  with the default three layers.
* :class:`SubPixelDecoder`: the same sizes in reverse with the sub-pixel convolution of Shi et
  al. (2016): a linear map to a ``channels x h0 x w0`` map, then per layer a 3x3 convolution to
  ``4 * channels`` channels and a :class:`torch.nn.PixelShuffle` of factor 2 (each output pixel
  block of 2x2 is read from 4 channels, no transposed convolution and no checkerboard
  artefacts), ReLU; a final 3x3 convolution gives one logit per pixel.

Frames travel flattened, as the sequence models see them: ``(..., H*W)`` for one channel (or
``(..., C*H*W)``); any leading shape (particles, batch, time) is folded into one batch axis for
the convolutions and restored after.
"""

import math

import torch.nn as nn

from pyro_seq.nn.mlp import MLP, layer_widths

__all__ = ["ConvEncoder", "FRAME_NETWORKS", "SubPixelDecoder", "frame_networks"]

#: Kinds of :func:`frame_networks`: the convolutional pair (appendix 6.8) or MLPs.
FRAME_NETWORKS = ("conv", "mlp")


def _check_image_shape(image_shape, layers):
    if len(image_shape) not in (2, 3) or any(
        isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in image_shape
    ):
        raise ValueError(
            f"image_shape must be (H, W) or (C, H, W) positive ints, got {image_shape!r}"
        )
    shape = tuple(image_shape) if len(image_shape) == 3 else (1,) + tuple(image_shape)
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
        raise ValueError(f"layers must be a positive int, got {layers!r}")
    factor = 2**layers
    if shape[1] % factor or shape[2] % factor:
        raise ValueError(
            f"image height and width must be divisible by 2**layers = {factor}, got {shape[1:]}"
        )
    return shape


class ConvEncoder(nn.Module):
    """Frames ``(..., C*H*W)`` -> flattened feature maps ``(..., out_dim)`` (appendix 6.8: 3
    layers of 32 filters, 3x3, stride 2, ReLU).

    :param tuple image_shape: ``(H, W)`` or ``(C, H, W)``; H and W divisible by ``2**layers``.
    :param int channels: filters per layer (32).
    :param int layers: convolutions (3).
    """

    def __init__(self, image_shape, channels=32, layers=3):
        super().__init__()
        self.image_shape = _check_image_shape(image_shape, layers)
        C, H, W = self.image_shape
        convs = []
        for i in range(layers):
            convs += [
                nn.Conv2d(C if i == 0 else channels, channels, 3, stride=2, padding=1),
                nn.ReLU(),
            ]
        self.convs = nn.Sequential(*convs)
        self.out_dim = channels * (H >> layers) * (W >> layers)

    def forward(self, x):
        lead = x.shape[:-1]
        if x.shape[-1] != math.prod(self.image_shape):
            raise ValueError(
                f"ConvEncoder expects frames of {math.prod(self.image_shape)} values "
                f"{self.image_shape}, got {x.shape[-1]}"
            )
        h = self.convs(x.reshape((-1,) + self.image_shape))
        return h.reshape(lead + (self.out_dim,))


class SubPixelDecoder(nn.Module):
    """Features ``(..., in_dim)`` -> pixel logits ``(..., C*H*W)`` by sub-pixel convolutions.

    :param int in_dim: input features (the KVAE's ``a_dim``).
    :param tuple image_shape: ``(H, W)`` or ``(C, H, W)``; H and W divisible by ``2**layers``.
    :param int channels: feature maps per layer (32).
    :param int layers: upsampling stages of factor 2 (3).
    """

    def __init__(self, in_dim, image_shape, channels=32, layers=3):
        super().__init__()
        self.image_shape = _check_image_shape(image_shape, layers)
        C, H, W = self.image_shape
        self.start = (channels, H >> layers, W >> layers)
        self.project = nn.Sequential(nn.Linear(in_dim, math.prod(self.start)), nn.ReLU())
        ups = []
        for _ in range(layers):
            ups += [nn.Conv2d(channels, 4 * channels, 3, padding=1), nn.PixelShuffle(2), nn.ReLU()]
        self.ups = nn.Sequential(*ups)
        self.out = nn.Conv2d(channels, C, 3, padding=1)

    def forward(self, a):
        lead = a.shape[:-1]
        h = self.project(a.reshape(-1, a.shape[-1])).reshape((-1,) + self.start)
        logits = self.out(self.ups(h))
        return logits.reshape(lead + (math.prod(self.image_shape),))


def frame_networks(kind, image_shape, code_dim, channels=32, layers=3, hidden_dims=(128, 128)):
    """The encoder body and the decoder of a per-frame VAE (KVAE, GTM-SM, their baselines).

    ``"conv"``: :class:`ConvEncoder` and :class:`SubPixelDecoder` (``channels``, ``layers``);
    ``"mlp"``: an MLP with hidden layers ``hidden_dims`` (ReLU, last layer activated) and a
    decoder MLP with the same layers in reverse. ``hidden_dims`` must hold positive ints
    (:func:`~pyro_seq.nn.mlp.layer_widths`) with either kind.

    :returns: ``(body, feature_dim, decoder)``: ``body`` maps frames ``(..., C*H*W)`` to
        features ``(..., feature_dim)`` (a distribution head or a linear code layer follows);
        ``decoder`` maps codes ``(..., code_dim)`` to one output per pixel ``(..., C*H*W)``.
    """
    hidden_dims = layer_widths(hidden_dims)  # checked with either kind: a bad value is a mistake
    if kind == "conv":
        body = ConvEncoder(image_shape, channels, layers)
        return body, body.out_dim, SubPixelDecoder(code_dim, image_shape, channels, layers)
    if kind != "mlp":
        raise ValueError(f"encoder must be one of {FRAME_NETWORKS}, got {kind!r}")
    if not hidden_dims:
        raise ValueError("hidden_dims must name at least one hidden layer, got ()")
    D = math.prod(image_shape)
    body = MLP(D, hidden_dims[:-1], hidden_dims[-1], "relu", activate_output=True)
    return body, hidden_dims[-1], MLP(code_dim, tuple(reversed(hidden_dims)), D, "relu")
