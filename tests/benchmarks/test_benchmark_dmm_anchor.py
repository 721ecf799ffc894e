"""The DMM speed benchmark times Pyro's real ``examples/dmm.py`` against the package's DMM.

Checks that the anchor (loaded by path from ``../shared/anchors/pyro-1.9.2``, see
``benchmarks/speed/anchors.py``) and ``pyro_seq.models.DMM`` with the same weights are the same
function, that the benchmark feeds them the same minibatches, and that the runner works end to
end on one minibatch. Skipped when the anchor files or the JSB pickle are not there.
"""

import json
import math
import sys
from pathlib import Path

import pyro
import pytest
import torch
from pyro.infer import Trace_ELBO
from torch.nn.utils.rnn import pad_packed_sequence

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path[:0] = [str(BENCHMARKS / "speed"), str(BENCHMARKS)]

import anchors  # noqa: E402
import dmm_speed  # noqa: E402

from pyro_seq.data import pad_sequences  # noqa: E402
from pyro_seq.models import DMM  # noqa: E402
from pyro_seq.nn import reverse_padded  # noqa: E402

#: Trace_ELBO losses are float32 sums of ~100 site terms: eps 1.2e-7 per addition, so up to
#: ~1.2e-5 relative (measured 5e-7 on the 6 sequences below)
RTOL = 1e-5
#: One site's log-density, a float32 sum of up to 6 x 100 terms (measured 1e-7 relative)
SITE_RTOL = 1e-6


@pytest.fixture(scope="module")
def anchor():
    try:
        return anchors.load_anchor()
    except anchors.AnchorMissing as e:
        pytest.skip(f"anchor not available: {e}")


@pytest.fixture
def short_batch(anchor):
    """The example's minibatch of its 6 shortest training sequences (lengths 25 to 33)."""
    lengths = anchor.data()["train"]["sequence_lengths"]
    indices = torch.argsort(lengths, stable=True)[:6].tolist()
    return indices, anchor.mini_batch(indices)


def test_anchor_code_is_the_shared_file(anchor):
    """What runs is the anchor's own code (compiled under its file name), and the loader the
    example imported is not left registered under Pyro's module name."""
    folder = anchors.anchor_dir()
    assert anchor.module.DMM.model.__code__.co_filename == str(folder / anchors.DMM_FILE)
    assert anchor.poly.get_mini_batch.__code__.co_filename == str(folder / anchors.LOADER_FILE)
    assert anchor.module.poly is anchor.poly
    assert sys.modules.get(anchors.LOADER_MODULE) is not anchor.poly
    assert anchor.defaults.mini_batch_size == 20 and not anchor.defaults.jit


def test_same_minibatch_contents(anchor, short_batch):
    """The example's minibatch (sorted longest first, reversed copy packed) holds the same
    sequences as the package's padded batch of the same indices, row for row up to that sort,
    and its reversed copy is each sequence reversed within its own length."""
    indices, (x, x_rev_packed, mask, lengths) = short_batch
    seqs = anchor.training_sequences()
    ours_x, ours_mask = pad_sequences([seqs[i] for i in indices])
    assert x.shape == ours_x.shape
    unmatched = list(range(len(indices)))
    for b in range(len(indices)):
        c = next(
            c
            for c in unmatched
            if torch.equal(x[b], ours_x[c]) and torch.equal(mask[b].bool(), ours_mask[c])
        )
        unmatched.remove(c)
    assert torch.equal(lengths, mask.sum(-1).long())
    assert lengths.tolist() == sorted(lengths.tolist(), reverse=True)
    x_rev, _ = pad_packed_sequence(x_rev_packed, batch_first=True)
    assert torch.equal(x_rev, reverse_padded(x, lengths))


def test_same_elbo_with_copied_weights_and_same_samples(anchor, short_batch):
    """log p(x, z) - log q(z | x) of the example's DMM and of pyro_seq's DMM with the same weights
    (and no scale floor, as in the example) at the same z: equal site by site to float32 rounding.
    A 1e-3 change of one output bias (ELBO change about 0.09 here) is detected."""
    _, batch = short_batch
    dmm, _ = anchor.make_svi()
    twin = anchors.pyro_seq_twin(dmm)
    scores = anchors.replayed_elbo(dmm, twin, batch)
    a, b = scores["example"], scores["pyro_seq"]
    T = batch[0].shape[1]
    assert sorted(a["guide"]) == sorted(b["guide"]) == sorted(f"z_{t}" for t in range(1, T + 1))
    assert sorted(a["model"]) == sorted(b["model"])
    assert len(a["model"]) == 2 * T
    for role in ("model", "guide"):
        for site, value in a[role].items():
            assert b[role][site] == pytest.approx(value, rel=SITE_RTOL, abs=1e-4), (role, site)
    summary = anchors.compare_elbos(scores)
    tolerance = dmm_speed.CHECK_RTOL * summary["sum_abs_site_terms"]  # the runner's check
    assert summary["elbo_abs_diff"] <= tolerance

    with torch.no_grad():
        twin.emitter[4].bias[0] += 1e-3
    off = anchors.compare_elbos(anchors.replayed_elbo(dmm, twin, batch))
    assert off["elbo_abs_diff"] > 3 * tolerance


def test_trace_elbo_losses_agree(anchor, short_batch):
    """With one seed, the example's Trace_ELBO loss (its training objective) equals minus the
    ELBO from its replayed traces, and equals the Trace_ELBO loss of pyro_seq's DMM with the same
    weights. The second needs both guides to draw the same noise: each draws one (batch, z_dim)
    standard normal per step, in time order, and nothing else; a guide that drew its noise
    differently would fail here without being wrong (test_same_elbo_... still holds then)."""
    _, batch = short_batch
    dmm, _ = anchor.make_svi()
    twin = anchors.pyro_seq_twin(dmm)
    losses = {}
    for key, run in {
        "example": lambda: Trace_ELBO().loss(dmm.model, dmm.guide, *batch),
        "pyro_seq": lambda: Trace_ELBO().loss(twin.model, twin.guide, batch[0], batch[2].bool()),
        "replayed": lambda: -anchors.replayed_elbo(dmm, twin, batch)["example"]["elbo"],
    }.items():
        pyro.set_rng_seed(5)
        losses[key] = run()
    assert losses["replayed"] == pytest.approx(losses["example"], rel=RTOL)
    assert losses["pyro_seq"] == pytest.approx(losses["example"], rel=RTOL)
    # a different seed gives a different loss (the agreement above is not a constant)
    pyro.set_rng_seed(6)
    other = Trace_ELBO().loss(dmm.model, dmm.guide, *batch)
    assert abs(other - losses["example"]) > 10 * RTOL * abs(losses["example"])


def test_runner_smoke(anchor, tmp_path):
    """benchmarks/speed/dmm_speed.py --smoke on one minibatch: its pre-timing check passes, every
    variant is timed once, and the ratios are those of the recorded medians."""
    out = tmp_path / "dmm_speed.json"
    result = dmm_speed.main(["--smoke", "--batches", "1", "--output", str(out)])
    saved = json.loads(out.read_text())
    assert saved["check_same_elbo"]["passed"] is True
    assert saved["check_same_elbo"]["elbo_abs_diff"] <= saved["check_same_elbo"]["tolerance"]
    assert saved["settings"]["batches_per_epoch"] == 1 and saved["settings"]["smoke"] is True
    assert saved["anchor"]["sha256"] == anchor.digests
    variants = {"pyro_example", "pyro_example_no_validation", "pyro_seq_validation", "pyro_seq"}
    assert set(saved["wall_seconds_per_epoch"]) == variants
    for name in variants:
        (wall,) = saved["wall_seconds_per_epoch"][name]
        (loss,) = saved["loss_per_step"][name]
        assert wall > 0 and math.isfinite(loss)
    med = saved["median_wall_seconds_per_epoch"]
    assert saved["ratio_pyro_seq_to_pyro_example"] == pytest.approx(
        med["pyro_seq"] / med["pyro_example"]
    )
    assert result["ratio_pyro_seq_to_pyro_example"] == saved["ratio_pyro_seq_to_pyro_example"]


def test_missing_anchor_is_a_clear_error(tmp_path):
    """Without the anchor files the loader names what it looked for and the runner exits."""
    with pytest.raises(anchors.AnchorMissing, match="examples_dmm.py"):
        anchors.anchor_dir(tmp_path)
    with pytest.raises(SystemExit, match="cannot time the anchor"):
        dmm_speed.main(["--smoke", "--anchors", str(tmp_path)])


def test_weight_map_is_complete():
    """Every parameter of pyro_seq's DMM is the image of exactly one example parameter name."""
    names = [n for n, _ in DMM(88).named_parameters()]
    example_names = ["z_0", "z_q_0", "h_0"] + [
        f"{m}.{p}"
        for m in (
            "emitter.lin_z_to_hidden",
            "emitter.lin_hidden_to_hidden",
            "emitter.lin_hidden_to_input",
            "trans.lin_gate_z_to_hidden",
            "trans.lin_gate_hidden_to_z",
            "trans.lin_proposed_mean_z_to_hidden",
            "trans.lin_proposed_mean_hidden_to_z",
            "trans.lin_sig",
            "trans.lin_z_to_loc",
            "combiner.lin_z_to_hidden",
            "combiner.lin_hidden_to_loc",
            "combiner.lin_hidden_to_scale",
        )
        for p in ("weight", "bias")
    ]
    example_names += [f"rnn.{p}_l0" for p in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
    assert sorted(anchors.pyro_seq_name(n) for n in example_names) == sorted(names)


def test_the_example_runner_follows_the_examples_annealing_and_resumes(anchor, tmp_path):
    """``benchmarks/diagnostics/pyro_dmm_example_run.py``: the annealing factor is the
    example's (0.2 at the first minibatch's start, linear per minibatch, 1 after its 1000
    epochs), and a run of 2 epochs equals 1 epoch plus 1 resumed from the checkpoint."""
    sys.path.insert(0, str(BENCHMARKS / "diagnostics"))
    import pyro_dmm_example_run as run

    d = anchor.defaults
    n = 12
    assert run.annealing_factor(0, 0, n, d) == pytest.approx(0.2 + 0.8 / (1000 * n))
    assert run.annealing_factor(999, n - 1, n, d) == pytest.approx(1.0)
    assert run.annealing_factor(1000, 0, n, d) == 1.0
    steps = [run.annealing_factor(e, b, n, d) for e in range(3) for b in range(n)]
    assert all(b - a == pytest.approx(0.8 / (1000 * n)) for a, b in zip(steps, steps[1:]))

    whole = run.main(
        [
            "--epochs",
            "2",
            "--checkpoint",
            str(tmp_path / "a.pt"),
            "--output",
            str(tmp_path / "a.json"),
        ]
    )
    run.main(
        [
            "--epochs",
            "1",
            "--checkpoint",
            str(tmp_path / "b.pt"),
            "--output",
            str(tmp_path / "b.json"),
        ]
    )
    resumed = run.main(
        [
            "--epochs",
            "2",
            "--checkpoint",
            str(tmp_path / "b.pt"),
            "--output",
            str(tmp_path / "b.json"),
        ]
    )
    assert whole["epochs_completed"] == resumed["epochs_completed"] == 2
    assert resumed["evaluations"][-1] == pytest.approx(whole["evaluations"][-1], rel=1e-6)
    assert math.isfinite(whole["last_test_elbo_per_step"])
