"""How far a diagonal reading of the Wiener prior's KL moves the bound of VOSP and VRAE.

Bayer & Osendorfer (2014), sec. 3.3, compute the KL of the recognition model
``q(z_{1:T}) = prod_t N(mu_t, diag s_t^2)`` from the Wiener prior by transforming ``q`` with the
difference map ``g_W(z)_t = z_t - z_{t-1}`` (Jacobian 1) and taking the KL of the result from a
white Gaussian. The transformed Gaussian is *not* diagonal: ``Var(g_W(z)_t) = s_t^2 + s_{t-1}^2``
and ``Cov(g_W(z)_t, g_W(z)_{t+1}) = -s_t^2``. The exact KL
(:func:`pyro_seq.distributions.wiener.kl_diagonal_normal_wiener`, which the package uses) keeps
the entropy of ``q``; reading the transformed Gaussian as diagonal replaces each step's entropy
``log s_t`` by ``log sqrt(s_t^2 + s_{t-1}^2)`` and so *under*-states the KL, for every latent
dimension and step t >= 2, by

    gap_t = 1/2 log(1 + s_{t-1}^2 / s_t^2)            (1/2 log 2 = 0.347 when s_t = s_{t-1}),

which makes the "bound" that much too high. The same 1/2 log 2 per step and dimension is the
floor of the exact KL of any step-wise independent ``q`` from the walk (``STORN``'s docstring).

For the trained zoo cells of the presets ``vosp_jsb`` and ``vrae_jsb`` (best weights of
``benchmarks/checkpoints/zoo_jsb_<tag>/<model>_elbo``), on the JSB test set, this script
reports per time step: the exact ELBO and its KL (``evaluate_bound``, ``--samples`` draws), the
KL floor ``(T_i - 1) z_dim log(2) / 2`` summed over sequences, the gap above from the
recognition scales, and the ELBO the diagonal reading would report (exact + gap). Writes
``benchmarks/results/wiener_kl_gap.json``::

    python benchmarks/diagnostics/wiener_kl_gap.py --data jsb_chorales.pickle
"""

import argparse
import json
import math
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import machine_info  # noqa: E402

from pyro_seq.data import load_piano_rolls  # noqa: E402
from pyro_seq.models import VOSP, VRAE  # noqa: E402
from pyro_seq.ops.padding import pad_sequences  # noqa: E402
from pyro_seq.ops.state import SequenceState  # noqa: E402
from pyro_seq.presets import get_preset  # noqa: E402
from pyro_seq.train import evaluate_bound  # noqa: E402
from pyro_seq.train.checkpoint import load_weights  # noqa: E402

CELLS = {"vosp": (VOSP, "vosp_jsb", "s20vosp"), "vrae": (VRAE, "vrae_jsb", "s20vrae")}


def diagonal_reading_gap(scale: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per sequence, the sum over steps t >= 2 and dimensions of
    ``1/2 log(1 + s_{t-1}^2 / s_t^2)``: scale ``(batch, T, Z)``, prefix mask ``(batch, T)`` ->
    ``(batch,)``."""
    var = scale.pow(2)
    terms = 0.5 * torch.log1p(var[:, :-1] / var[:, 1:]).sum(-1)  # (batch, T - 1): t = 2..T
    return terms.masked_fill(~mask[:, 1:], 0.0).sum(-1)


def measure(name, test, args):
    cls, preset_name, tag = CELLS[name]
    preset = get_preset(preset_name)
    model = cls.for_data(88, 0, **preset.model_options)
    folder = ROOT / "benchmarks" / "checkpoints" / f"zoo_jsb_{tag}" / f"{name}_elbo"
    model.load_state_dict(load_weights(folder / "best.pt"))
    model.eval()
    torch.manual_seed(0)
    exact = evaluate_bound(model, test, batch_size=16, method="elbo", num_particles=args.samples)
    x, mask = pad_sequences(test)
    gap, steps = 0.0, int(mask.sum())
    with torch.no_grad():
        for i in range(0, x.shape[0], 16):
            state = SequenceState()
            model.guide_init(state, x[i : i + 16], mask[i : i + 16])
            gap += float(diagonal_reading_gap(state.shared["q_scale"], mask[i : i + 16]).sum())
    floor = sum(len(s) - 1 for s in test) * model.z_dim * math.log(2) / 2
    return {
        "preset": preset_name,
        "weights": str(folder.relative_to(ROOT) / "best.pt"),
        "z_dim": model.z_dim,
        "prior": model.prior,
        "test_steps": steps,
        "exact_elbo_per_step": exact["per_step"],
        "exact_kl_per_step": exact["kl_per_step"],
        "kl_floor_per_step": floor / steps,
        "diagonal_reading_gap_per_step": gap / steps,
        "diagonal_reading_elbo_per_step": exact["per_step"] + gap / steps,
        "published_bound_per_step": preset.published,
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="path of jsb_chorales.pickle")
    p.add_argument("--models", nargs="+", default=list(CELLS), choices=list(CELLS))
    p.add_argument("--samples", type=int, default=4, help="ELBO samples per sequence")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    test = load_piano_rolls(args.data)["test"]
    results = {name: measure(name, test, args) for name in args.models}
    for name, r in results.items():
        print(
            f"{name}: exact ELBO {r['exact_elbo_per_step']:.4f} (KL {r['exact_kl_per_step']:.4f}, "
            f"floor {r['kl_floor_per_step']:.4f}); diagonal reading "
            f"{r['diagonal_reading_elbo_per_step']:.4f} (+{r['diagonal_reading_gap_per_step']:.4f}); "
            f"published {r['published_bound_per_step']}"
        )
    out = ROOT / "benchmarks" / "results" / "wiener_kl_gap.json"
    payload = {"benchmark": "wiener_kl_gap", "settings": vars(args), "results": results}
    payload["machine"] = machine_info()
    out.write_text(json.dumps(payload, indent=1))
    print(f"wrote {out}")
    return results


if __name__ == "__main__":
    main()
