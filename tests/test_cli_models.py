"""Every architecture of the zoo trains, evaluates and samples from the command line."""

import pytest

from pyro_seq.cli import main

SMALL = {
    "vrnn": [
        "--z-dim",
        "2",
        "--model-option",
        "d_dim=6",
        "--model-option",
        "hidden_dim=6",
        "--model-option",
        "feature_dim=6",
    ],
    "vaernn": ["--z-dim", "2", "--model-option", "d_dim=6", "--model-option", "hidden_dim=6"],
    "storn": ["--z-dim", "2", "--model-option", "rnn_dim=6", "--model-option", "emission_dim=6"],
    "vosp": [
        "--z-dim",
        "2",
        "--model-option",
        "rnn_dim=6",
        "--model-option",
        "emission_dim=6",
        "--model-option",
        'prior="white"',
    ],
    "vrae": [
        "--z-dim",
        "2",
        "--model-option",
        "encoder_dim=6",
        "--model-option",
        "decoder_dim=6",
        "--model-option",
        "emission_dim=6",
    ],
    "rnn": ["--model-option", "d_dim=6", "--model-option", "hidden_dim=6"],
}


@pytest.mark.parametrize("model", sorted(SMALL))
def test_train_evaluate_sample_every_model(model, tiny_pickle, tmp_path, capsys):
    out = tmp_path / model
    args = [
        "train",
        "--model",
        model,
        "--data",
        str(tiny_pickle),
        "--epochs",
        "1",
        "--quiet",
        "--batch-size",
        "4",
        "--out",
        str(out),
    ] + SMALL[model]
    assert main(args) == 0
    assert main(["evaluate", str(out), "--objective", "iwae", "--particles", "2"]) == 0
    assert main(["sample", str(out), "--length", "4"]) == 0
    text = capsys.readouterr().out
    assert "test ELBO" in text and "iwae (K=2)" in text and (out / "sample_0.mid").exists()


def test_bad_model_option_is_one_line(tiny_pickle, tmp_path):
    with pytest.raises(SystemExit) as info:
        main(
            [
                "train",
                "--model",
                "storn",
                "--data",
                str(tiny_pickle),
                "--epochs",
                "1",
                "--quiet",
                "--out",
                str(tmp_path / "x"),
                "--model-option",
                'prior="brownian"',
            ]
        )
    assert str(info.value.code).startswith("pyro-seq: error: bad model option for storn:")
    assert "prior" in str(info.value.code)


def test_impute_and_denoise_commands_write_results_and_figures(tiny_pickle, tmp_path, capsys):
    import json

    out = tmp_path / "run"
    args = [
        "train",
        "--model",
        "dmm",
        "--data",
        str(tiny_pickle),
        "--epochs",
        "1",
        "--quiet",
        "--batch-size",
        "4",
        "--out",
        str(out),
        "--z-dim",
        "2",
        "--model-option",
        "rnn_dim=6",
        "--model-option",
        "transition_dim=6",
        "--model-option",
        "emission_dim=6",
    ]
    assert main(args) == 0
    for method in ("iterative", "importance"):
        assert (
            main(
                [
                    "impute",
                    str(out),
                    "--drop",
                    "3",
                    "--method",
                    method,
                    "--iterations",
                    "3",
                    "--particles",
                    "4",
                ]
            )
            == 0
        )
        result = json.loads((out / f"impute_test_{method}.json").read_text())
        assert result["missing_elements"] == 3 * 88 * result["num_sequences"]
        assert 0 < result["bits_per_element"] < 20 and 0 < result["baseline_bits_per_element"] < 20
    assert (out / "impute_test_0.png").exists()
    assert main(["denoise", str(out), "--flip", "0.1"]) == 0
    result = json.loads((out / "denoise_test.json").read_text())
    assert 0.05 < result["error_rate_corrupted"] < 0.15 and (out / "denoise_test_0.png").exists()
    assert "bits/element" in capsys.readouterr().out


def test_rtrbm_trains_with_cd_and_evaluates_by_ais_and_exactly(tiny_pickle, tmp_path, capsys):
    out = tmp_path / "rtrbm"
    args = [
        "train",
        "--model",
        "rtrbm",
        "--objective",
        "cd",
        "--cd-steps",
        "2",
        "--data",
        str(tiny_pickle),
        "--epochs",
        "2",
        "--quiet",
        "--batch-size",
        "4",
        "--out",
        str(out),
        "--model-option",
        "num_hidden=4",
    ]
    assert main(args) == 0
    assert main(["evaluate", str(out), "--objective", "exact"]) == 0
    assert main(["evaluate", str(out), "--particles", "50", "--betas", "200"]) == 0  # AIS default
    assert main(["sample", str(out), "--length", "4"]) == 0
    text = capsys.readouterr().out
    assert "test pseudo-log-likelihood" in text and "exact (K=1)" in text and "ais (K=50)" in text
    import json

    exact = json.loads((out / "eval_test_exact_1.json").read_text())
    ais = json.loads((out / "eval_test_ais_50.json").read_text())
    assert abs(ais["per_step"] - exact["per_step"]) <= 4 * ais["stderr_per_step"] + 1e-3
    with pytest.raises(SystemExit, match="objective cd"):
        main(
            [
                "train",
                "--model",
                "rtrbm",
                "--data",
                str(tiny_pickle),
                "--epochs",
                "1",
                "--quiet",
                "--out",
                str(tmp_path / "bad"),
            ]
        )
    with pytest.raises(SystemExit, match="energy-based"):
        main(["evaluate", str(out), "--objective", "iwae"])


def test_kvae_trains_and_imputes_videos_from_the_command_line(tmp_path, capsys, monkeypatch):
    pytest.importorskip("pymunk", reason="the box videos need the 'sim' extra (pymunk)")
    import json

    monkeypatch.setenv("PYRO_SEQ_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "kvae"
    assert (
        main(
            [
                "train",
                "--model",
                "kvae",
                "--data",
                "box:10",
                "--epochs",
                "1",
                "--quiet",
                "--batch-size",
                "5",
                "--kl-anneal-steps",
                "0",
                "--missing-prob",
                "0.3",
                "--out",
                str(out),
                "--model-option",
                "channels=4",
                "--model-option",
                "lstm_dim=4",
            ]
        )
        == 0
    )
    for method in ("smoothing", "filtering", "generation"):
        assert (
            main(
                [
                    "impute",
                    str(out),
                    "--data",
                    "box:10",
                    "--drop-prob",
                    "0.5",
                    "--num",
                    "2",
                    "--method",
                    method,
                ]
            )
            == 0
        )
        result = json.loads((out / f"impute_test_{method}.json").read_text())
        assert 0.0 <= result["pixel_error"] <= 1.0 and result["missing_elements"] > 0
    assert (out / "impute_test_0.png").exists()
    assert "pixel error" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="does not hold 1024 values"):
        main(
            [
                "train",
                "--model",
                "kvae",
                "--data",
                "box:10",
                "--epochs",
                "1",
                "--quiet",
                "--out",
                str(tmp_path / "y"),
                "--model-option",
                "image_shape=[4,4]",
            ]
        )


def test_gtmsm_trains_on_image_navigation_from_the_command_line(tmp_path, capsys, monkeypatch):
    """pyro-seq train --model gtmsm --data image_navigation:N:T: actions packed in the features;
    the test bound is over the prediction steps (T - tau per sequence)."""
    pytest.importorskip("sklearn", reason="image_navigation needs the 'images' extra")
    pytest.importorskip("PIL", reason="image_navigation needs the 'images' extra")
    import json

    from pyro_seq.cli import build_model
    from pyro_seq.data import load_dataset

    monkeypatch.setenv("PYRO_SEQ_CACHE", str(tmp_path / "cache"))
    data = load_dataset("image_navigation:5:12", splits=("train",))
    assert len(data["train"]) == 5 and data["train"][0].shape == (12, 64)
    assert data["train"].inputs[0].shape == (12, 5)  # the one-hot actions as known inputs
    assert (data["train"].inputs[0].sum(-1) == 1).all()
    out = tmp_path / "gtmsm"
    opts = [
        "--model-option",
        "tau=8",
        "--model-option",
        "z_dim=3",
        "--model-option",
        "hidden_dims=[8]",
        "--model-option",
        "wall_hidden=4",
    ]
    assert (
        main(
            [
                "train",
                "--model",
                "gtmsm",
                "--data",
                "image_navigation:5:12",
                "--epochs",
                "1",
                "--quiet",
                "--batch-size",
                "5",
                "--kl-anneal-steps",
                "0",
                "--out",
                str(out),
            ]
            + opts
        )
        == 0
    )
    result = json.loads((out / "test.json").read_text())
    assert result["num_sequences"] == 1 and result["num_steps"] == 12
    assert "test ELBO" in capsys.readouterr().out
    assert json.loads((out / "config.json").read_text())["input_dim"] == 5
    assert not build_model("gtmsm", 64, {"tau": 8}, input_dim=5).pack_actions
    assert main(["evaluate", str(out), "--objective", "iwae", "--particles", "2"]) == 0
    landmark = tmp_path / "gtmsm_landmark"  # the inference network of thesis appendix 7.10
    assert (
        main(
            [
                "train",
                "--model",
                "gtmsm",
                "--data",
                "image_navigation:5:12",
                "--epochs",
                "1",
                "--quiet",
                "--batch-size",
                "5",
                "--inference",
                "landmark",
                "--out",
                str(landmark),
            ]
            + opts
        )
        == 0
    )
    config = json.loads((landmark / "config.json").read_text())
    assert config["model_options"]["inference"] == "landmark"
    with pytest.raises(SystemExit, match="inference must be one of"):
        build_model("gtmsm", 69, {"inference": "smoothing"})
    # the learning aids (ours): conformal M, a warm-up of K, faster transition learning
    recipe = tmp_path / "gtmsm_recipe"
    assert (
        main(
            [
                "train",
                "--model",
                "gtmsm",
                "--data",
                "image_navigation:5:12",
                "--epochs",
                "2",
                "--quiet",
                "--batch-size",
                "5",
                "--kl-anneal-steps",
                "0",
                "--out",
                str(recipe),
                "--model-option",
                "displacements=conformal",
                "--model-option",
                "neighbour_warmup=[8,2]",
                "--model-option",
                "wall_lr_multiplier=10",
            ]
            + opts
        )
        == 0
    )
    m = build_model(
        "gtmsm", 64, json.loads((recipe / "config.json").read_text())["model_options"], input_dim=5
    )
    assert m.displacements == "conformal" and m.neighbour_warmup == (8, 2)
    assert m.lr_multipliers == {"wall_net": 10.0}
    m = build_model("gtmsm", 3 * 64 + 5, {"hidden_dims": [8]})  # the packed compatibility path
    assert m.frame_shape == (3, 8, 8) and m.pack_actions
    with pytest.raises(SystemExit, match="not a square frame"):
        build_model("gtmsm", 50 + 5, {})
    with pytest.raises(
        SystemExit,
        match="pack_actions must be false when the data carry the actions as inputs, true when the actions are packed",
    ):
        build_model("gtmsm", 69, {"pack_actions": False})
    with pytest.raises(ValueError, match="image_navigation:N:T"):
        load_dataset("image_navigation:5:x")


TINY_DMM = [
    "--z-dim",
    "2",
    "--model-option",
    "rnn_dim=6",
    "--model-option",
    "transition_dim=6",
    "--model-option",
    "emission_dim=6",
]


def test_forecast_command_scores_the_true_continuation(tiny_pickle, tmp_path, capsys):
    """pyro-seq forecast: the numbers of forecast_test.json recomputed by hand from the same
    draws of pyro_seq.tasks.forecast: log (1/S) sum_s prod_d Bernoulli(x_d | p_sd) per step,
    the mean absolute error of the mean forecast, and the two baselines."""
    import json

    import torch

    from pyro_seq.cli import _load_run
    from pyro_seq.data import load_dataset
    from pyro_seq.tasks import forecast

    out = tmp_path / "dmm"
    assert (
        main(
            [
                "train",
                "--model",
                "dmm",
                "--data",
                str(tiny_pickle),
                "--epochs",
                "1",
                "--quiet",
                "--batch-size",
                "4",
                "--out",
                str(out),
            ]
            + TINY_DMM
        )
        == 0
    )
    capsys.readouterr()
    assert (
        main(
            [
                "forecast",
                str(out),
                "--prefix",
                "3",
                "--steps",
                "2",
                "--num-samples",
                "4",
                "--seed",
                "1",
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    result = json.loads((out / "forecast_test.json").read_text())
    data = load_dataset(str(tiny_pickle))
    seqs = [s for s in data["test"] if s.shape[0] >= 5]
    assert result["num_sequences"] == len(seqs) > 0 and result["num_samples"] == 4
    x = torch.stack([s[:5] for s in seqs])
    prefix, truth = x[:, :3], x[:, 3:].double()
    _, model = _load_run(out)
    torch.manual_seed(1)
    means = forecast(model, prefix, 2, num_samples=4).means.double()  # (S, B, K, D)
    per_path = (truth * means.log() + (1 - truth) * (1 - means).log()).sum(-1)  # (S, B, K)
    mixture = per_path.exp().mean(0).log()  # (B, K)
    assert result["log_likelihood_per_step"] == pytest.approx(float(mixture.mean()), rel=1e-5)
    assert result["log_likelihood_by_step"] == pytest.approx(mixture.mean(0).tolist(), rel=1e-5)
    mae = (means.mean(0) - truth).abs()
    assert result["mean_absolute_error"] == pytest.approx(float(mae.mean()), rel=1e-5)
    assert result["mean_absolute_error_by_step"] == pytest.approx(
        mae.mean((0, 2)).tolist(), rel=1e-5
    )
    assert result["baseline_mean_absolute_error"] == pytest.approx(
        float((prefix[:, -1:].double() - truth).abs().mean()), rel=1e-6
    )
    freq = torch.cat(data["train"]).double().mean(0)
    base = torch.distributions.Bernoulli(probs=freq).log_prob(truth).sum(-1).mean()
    assert result["baseline_log_likelihood_per_step"] == pytest.approx(float(base), rel=1e-5)
    assert (out / "forecast_test_0.png").stat().st_size > 0
    assert (
        f"forecast 2 steps after 3 of {len(seqs)} test sequences (4 samples): "
        f"log-likelihood {result['log_likelihood_per_step']:.4f} nats per step" in text
    )


def test_forecast_command_on_real_valued_data(tmp_path, capsys):
    """Gaussian emissions: no log-likelihood of the target (pyro_seq.tasks.forecast scores
    Bernoulli emissions only), the mean absolute error and a line plot."""
    pytest.importorskip("aeon", reason="japanese_vowels comes with the aeon package")
    import json

    out = tmp_path / "dmm"
    assert (
        main(
            [
                "train",
                "--model",
                "dmm",
                "--data",
                "japanese_vowels",
                "--epochs",
                "1",
                "--quiet",
                "--batch-size",
                "50",
                "--out",
                str(out),
                "--model-option",
                'likelihood="gaussian"',
            ]
            + TINY_DMM
        )
        == 0
    )
    capsys.readouterr()
    assert (
        main(
            [
                "forecast",
                str(out),
                "--prefix",
                "5",
                "--steps",
                "3",
                "--num",
                "3",
                "--num-samples",
                "5",
            ]
        )
        == 0
    )
    result = json.loads((out / "forecast_test.json").read_text())
    assert result["num_sequences"] == 3 and "log_likelihood_per_step" not in result
    assert len(result["mean_absolute_error_by_step"]) == 3 and result["mean_absolute_error"] > 0
    assert (out / "forecast_test_0.png").stat().st_size > 0
    assert "mean absolute error" in capsys.readouterr().out


def test_pendulum_trains_the_controlled_kvae_and_a_dmm_conditioned_on_the_torques(
    tmp_path, monkeypatch, capsys
):
    """The pendulum's torques travel as known inputs: ``--data pendulum`` trains the KVAE with
    controls of Fraccaro (2018), Table 6.1 (control_dim 1) and a DMM conditioned on them."""
    import json

    from pyro_seq.cli import _load_run

    monkeypatch.setenv("PYRO_SEQ_CACHE", str(tmp_path / "cache"))
    kvae = [
        "--model-option",
        'encoder="mlp"',
        "--model-option",
        "hidden_dims=[8]",
        "--model-option",
        "lstm_dim=4",
        "--model-option",
        "z_dim=2",
    ]
    dmm = [
        "--z-dim",
        "2",
        "--model-option",
        "rnn_dim=6",
        "--model-option",
        "transition_dim=6",
        "--model-option",
        "emission_dim=6",
    ]
    for name, options in (("kvae", kvae), ("dmm", dmm)):
        out = tmp_path / name
        assert (
            main(
                [
                    "train",
                    "--model",
                    name,
                    "--data",
                    "pendulum:5",
                    "--epochs",
                    "1",
                    "--batch-size",
                    "5",
                    "--quiet",
                    "--out",
                    str(out),
                ]
                + options
            )
            == 0
        )
        assert json.loads((out / "config.json").read_text())["input_dim"] == 1
        _, model = _load_run(out)
        assert model.input_dim == 1  # KVAE: B_t u_t; DMM: p(z_t | z_{t-1}, u_t)
        assert main(["impute", str(out), "--drop", "2", "--iterations", "2"]) == 0
        assert (
            main(["forecast", str(out), "--prefix", "4", "--steps", "2", "--num-samples", "2"]) == 0
        )
    # a model that takes no inputs trains on the frames alone only when asked
    with pytest.raises(SystemExit, match="takes no inputs .*"):
        main(
            [
                "train",
                "--model",
                "storn",
                "--data",
                "pendulum:5",
                "--epochs",
                "1",
                "--quiet",
                "--out",
                str(tmp_path / "storn"),
            ]
        )
    assert (
        main(
            [
                "train",
                "--model",
                "storn",
                "--data",
                "pendulum:5",
                "--epochs",
                "1",
                "--quiet",
                "--ignore-inputs",
                "--model-option",
                "rnn_dim=4",
                "--model-option",
                "emission_dim=4",
                "--z-dim",
                "2",
                "--out",
                str(tmp_path / "storn"),
            ]
        )
        == 0
    )
