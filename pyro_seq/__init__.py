"""pyro-seq: deep latent-variable models for sequential data, written for Pyro.

Layers (imports point down only): ``ops`` -> ``distributions`` -> ``infer``; ``nn``;
``models`` (model/guide pairs); ``data``; ``train`` and ``cli`` on top.
"""

__version__ = "0.1.0"
