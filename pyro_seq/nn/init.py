"""Weight initialisation: the SRNN authors' scheme and a data-dependent Bernoulli output bias.

The SRNN code of Fraccaro et al. (2016; Theano/Lasagne, polyphonic-music defaults
``init_mlp='normal'``, ``init_rnn='orthogonal'``) initialises

* every dense layer with Glorot-normal weights, ``N(0, 2 / (fan_in + fan_out))``, and zero
  biases;
* every GRU gate (reset, update, candidate) with (semi-)orthogonal input-to-hidden *and*
  hidden-to-hidden matrices, one per gate, and zero biases.

:func:`init_weights` applies this to any torch module (``scheme="srnn"``); ``scheme="normal"``
is the simpler variant with ``N(0, std^2)`` dense and input-to-hidden weights (``std=0.05``,
the range the SRNN code uses for its uniform RNN initialiser) and orthogonal hidden-to-hidden
blocks. :func:`init_output_bias` sets the bias of a Bernoulli emission's last layer to the
logits of the training set's per-unit frequencies, so that the untrained model starts at the
independent-Bernoulli fit of the data rather than at ``p = 1/2`` for every note (61 nats per
step for 88 keys); this last step is not in the SRNN code.
"""

import torch
import torch.nn as nn

__all__ = ["INIT_SCHEMES", "bernoulli_output_layer", "init_output_bias", "init_weights"]

INIT_SCHEMES = ("srnn", "normal")
_RNN_GATES = {nn.GRU: 3, nn.LSTM: 4, nn.RNN: 1}


def _rnn_gates(module):
    for cls, gates in _RNN_GATES.items():
        if isinstance(module, cls):
            return gates
    return None


@torch.no_grad()
def _orthogonal_blocks(weight, gates):
    """(Semi-)orthogonal init of each of ``gates`` stacked ``(H, n)`` blocks of ``weight``."""
    for block in weight.chunk(gates, dim=0):
        nn.init.orthogonal_(block)


@torch.no_grad()
def init_weights(module, scheme="srnn", std=0.05):
    """Initialise every ``Linear`` and recurrent layer inside ``module`` in place.

    :param torch.nn.Module module: e.g. a :class:`~pyro_seq.models.SRNN`.
    :param str scheme: ``"srnn"``: dense weights Glorot normal, every gate's input-to-hidden and
        hidden-to-hidden matrix (semi-)orthogonal, all biases zero (the SRNN code's defaults).
        ``"normal"``: dense and input-to-hidden weights ``N(0, std^2)``, hidden-to-hidden
        blocks orthogonal, biases zero.
    :param float std: standard deviation of ``scheme="normal"``.
    :returns: ``module``.

    Recurrent weights are initialised per gate: torch stacks the gates of a GRU (LSTM) in
    ``weight_hh_l*`` of shape ``(3H, H)`` (``(4H, H)``), and each ``(H, H)`` block is
    orthogonal, ``W W^T = I``. Draws use torch's global RNG. Other parameters (e.g. a learned
    initial state) are left unchanged.
    """
    if scheme not in INIT_SCHEMES:
        raise ValueError(f"unknown init scheme {scheme!r}; choose from {INIT_SCHEMES}")
    for sub in module.modules():
        if isinstance(sub, nn.Linear):
            if scheme == "srnn":
                nn.init.xavier_normal_(sub.weight)
            else:
                nn.init.normal_(sub.weight, 0.0, std)
            if sub.bias is not None:
                nn.init.zeros_(sub.bias)
            continue
        gates = _rnn_gates(sub)
        if gates is None:
            continue
        for name, param in sub.named_parameters(recurse=False):
            if name.startswith("weight_hh"):
                _orthogonal_blocks(param, gates)
            elif name.startswith("weight_ih"):
                if scheme == "srnn":
                    _orthogonal_blocks(param, gates)
                else:
                    nn.init.normal_(param, 0.0, std)
            elif name.startswith("bias"):
                nn.init.zeros_(param)
    return module


def bernoulli_output_layer(model):
    """The ``Linear`` layer whose outputs are the Bernoulli logits of ``model``'s emission, or
    None when the model has no Bernoulli emission (``model.binary_observations`` false, or an
    emission network that does not end in a ``Linear`` layer)."""
    if not getattr(model, "binary_observations", False):
        return None
    emitter = getattr(model, "emitter", None)
    if isinstance(emitter, nn.Linear):
        return emitter
    if isinstance(emitter, nn.Sequential) and len(emitter) and isinstance(emitter[-1], nn.Linear):
        return emitter[-1]
    return None


@torch.no_grad()
def init_output_bias(model, train_sequences, eps=1e-3):
    """Set the Bernoulli emission's output bias to ``logit(clamp(mean_x, eps, 1 - eps))``.

    ``mean_x`` is the frequency of each unit (note) over all time steps of all training
    sequences; ``eps`` keeps units that are always off (or on) at finite logits (``logit(1e-3)``
    is -6.9).

    :param model: a model with a Bernoulli emission (see :func:`bernoulli_output_layer`).
    :param list train_sequences: tensors ``(T_i, D)`` of 0/1 values.
    :returns: the bias that was set, ``(D,)``.
    :raises ValueError: the model has no Bernoulli emission or no training steps are given.
    """
    layer = bernoulli_output_layer(model)
    if layer is None or layer.bias is None:
        raise ValueError(
            "init_output_bias needs a model whose Bernoulli emission ends in a "
            "Linear layer with a bias"
        )
    if not train_sequences or sum(len(s) for s in train_sequences) == 0:
        raise ValueError("init_output_bias needs at least one training time step")
    frames = torch.cat([torch.as_tensor(s, dtype=torch.float64) for s in train_sequences], 0)
    mean = frames.mean(0).clamp(eps, 1.0 - eps)
    bias = torch.log(mean) - torch.log1p(-mean)
    layer.bias.copy_(bias.to(layer.bias.dtype))
    return layer.bias.detach().clone()
