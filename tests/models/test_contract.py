"""The model contract: one declaration per model, read by every surface, and no state carried
from one call to the next."""

import ast
import copy
import inspect
from pathlib import Path

import pyro
import pyro.poutine as poutine
import pytest
import torch

import pyro_seq
from pyro_seq.models import MODELS, EnergyBasedModel, ModelContract, SequenceModel, Unsupported
from pyro_seq.models.contract import TASKS
from pyro_seq.tasks import impute
from pyro_seq.train.objectives import ENERGY_OBJECTIVES, OBJECTIVES
from tests.models.test_kvae import small_kvae

PACKAGE = Path(pyro_seq.__file__).parent
#: the surfaces that must read the contract only
SURFACES = sorted(
    [
        *PACKAGE.joinpath("train").glob("*.py"),
        *PACKAGE.glob("cli*.py"),  # cli.py and the modules it is split into
        PACKAGE / "tasks.py",
        *(p for p in PACKAGE.joinpath("infer").glob("*.py") if p.name != "protocol.py"),
    ]
)
MODEL_CLASS_NAMES = {
    cls.__name__
    for cls in vars(pyro_seq.models).values()
    if inspect.isclass(cls) and issubclass(cls, ModelContract) and cls is not ModelContract
}
#: names a program variable may go by in the surfaces
MODEL_NAMES = {"model", "owner", "m", "net"}


def _declared_names():
    names = set()
    for cls in (ModelContract, SequenceModel, EnergyBasedModel):
        names |= {n for n in vars(cls) if not n.startswith("__")}
    return names


def _offences(path):
    """``isinstance`` on model classes and ``getattr``/``hasattr`` on models in ``path``."""
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        if node.func.id == "isinstance" and len(node.args) == 2:
            named = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
            named |= {n.attr for n in ast.walk(node.args[1]) if isinstance(n, ast.Attribute)}
            if named & MODEL_CLASS_NAMES:
                found.append(
                    f"{path.name}:{node.lineno}: isinstance on {named & MODEL_CLASS_NAMES}"
                )
        if node.func.id in ("getattr", "hasattr") and node.args:
            target = node.args[0]
            name = (
                target.id
                if isinstance(target, ast.Name)
                else (target.attr if isinstance(target, ast.Attribute) else None)
            )
            if name in MODEL_NAMES or (name or "").endswith("model"):
                found.append(f"{path.name}:{node.lineno}: {node.func.id} on {name}")
    return found


def test_surfaces_read_only_the_contract():
    """No class checks of models and no attribute probes in the trainer, the CLI, the tasks and
    the estimators (program probes live in pyro_seq.infer.protocol only)."""
    assert len(SURFACES) > 10
    offences = [o for path in SURFACES for o in _offences(path)]
    assert offences == []


def test_the_scanner_finds_what_it_must():
    """The scan above can fail: it flags the probes that the surfaces used to make."""
    bad = PACKAGE.parent / "tests" / "models" / "_probe_example.py"
    bad.write_text(
        "def f(model):\n    from pyro_seq.models import SRNN\n"
        "    a = isinstance(model, SRNN)\n    b = getattr(model, 'energy_based', False)\n"
        "    c = hasattr(model, 'impute_frames')\n    return a, b, c\n"
    )
    try:
        assert len(_offences(bad)) == 3
    finally:
        bad.unlink()


def test_the_contract_declares_every_name_the_surfaces_read():
    declared = _declared_names()
    for name in (
        "input_dim",
        "energy_based",
        "binary_observations",
        "generate",
        "tasks",
        "training_epoch",
        "lr_multipliers",
        "initialise",
        "objectives",
        "evaluation_methods",
        "impute_methods",
        "frame_shape",
        "for_data",
        "require",
    ):
        assert name in declared, name


@pytest.mark.parametrize("name", sorted(MODELS))
def test_each_declaration_is_backed_by_an_implementation(name):
    cls = MODELS[name]
    assert issubclass(cls, ModelContract)
    assert set(cls.tasks) <= set(TASKS)
    assert set(cls.objectives) <= set(OBJECTIVES + ENERGY_OBJECTIVES)
    generates = cls.generate is not ModelContract.generate
    assert ("generate" in cls.tasks) == generates, name
    own_methods = set(cls.impute_methods) - {"iterative", "importance"}
    assert bool(own_methods) == (cls.impute_steps is not ModelContract.impute_steps), name
    assert cls.energy_based == issubclass(cls, EnergyBasedModel)
    if cls.energy_based:  # the energy-based surfaces call these
        for method in ("log_likelihood", "pseudo_log_likelihood", "init_visible_bias"):
            assert callable(getattr(cls, method, None)) or not cls.trains_on_sequences, method


@pytest.mark.parametrize("name", sorted(MODELS))
def test_refusals_are_one_line_naming_the_model(name):
    cls = MODELS[name]
    model = cls.__new__(cls)  # the messages need only class declarations
    for task in TASKS:
        if task not in cls.tasks:
            message = cls.refusal(model, task)
            assert "\n" not in message and message.startswith(f"{cls.module_name} does not support")
    for objective in OBJECTIVES + ENERGY_OBJECTIVES:
        if objective not in cls.objectives:
            message = cls.refusal(model, objective, "objective")
            assert "\n" not in message and ("use" in message or "supports" in message), message


def test_require_raises_unsupported_as_a_value_error():
    m = MODELS["gtmsm"](
        frame_shape=(4, 4), tau=2, num_neighbours=2, hidden_dims=(4,), z_dim=2, wall_hidden=4
    )
    with pytest.raises(Unsupported, match="^gtmsm does not support task sample: .*GTMSM.predict"):
        m.require("generate")
    assert isinstance(Unsupported("x"), ValueError)
    with pytest.raises(Unsupported, match="gtmsm does not support task sample"):
        m.generate(2, 3)


# ---------------------------------------------------------------- no state between calls


def _kvae_log_joint(m, x, observed):
    """log p(x, a) - log q(a | x) of one guide draw (seed fixed), model replayed on it."""
    pyro.set_rng_seed(0)
    guide = poutine.trace(m.guide).get_trace(x, None, observed=observed)
    model = poutine.trace(poutine.replay(m.model, trace=guide)).get_trace(
        x, None, observed=observed
    )
    return model.log_prob_sum() - guide.log_prob_sum()


def test_kvae_scoring_of_a_call_does_not_depend_on_the_previous_call():
    """Review defect: whether every step was scored at once was decided from the previous
    call's data, so a call with missing frames after a complete-data call scored the guide's
    placeholder codes as observed."""
    torch.manual_seed(0)
    m = small_kvae()
    fresh = copy.deepcopy(m)
    x = (torch.rand(2, 6, 64) < 0.3).double()
    observed = torch.ones(2, 6, 64, dtype=torch.bool)
    observed[:, 2:4] = False
    _kvae_log_joint(m, x, None)  # a complete-data call first
    after = _kvae_log_joint(m, x, observed)
    expected = _kvae_log_joint(fresh, x, observed)
    assert torch.equal(after, expected)


def test_kvae_scores_all_steps_at_once_exactly_when_no_frame_is_missing(monkeypatch):
    """The all-at-once path runs for complete data (so the agreement tests exercise it) and
    never with a missing frame."""
    from pyro_seq.models.kvae import KVAE

    calls = []
    original = KVAE._model_all_steps
    monkeypatch.setattr(
        KVAE, "_model_all_steps", lambda self, *a: calls.append(1) or original(self, *a)
    )
    torch.manual_seed(0)
    m = small_kvae()
    x = (torch.rand(2, 6, 64) < 0.3).double()
    observed = torch.ones(2, 6, 64, dtype=torch.bool)
    observed[1, 3] = False
    for seen, expected in ((None, 1), (observed, 0), (None, 1)):
        calls.clear()
        _kvae_log_joint(m, x, seen)
        assert len(calls) == expected


def test_importance_imputation_uses_the_true_likelihood_in_training_mode():
    """Review defect: a KVAE in training mode weighted the particles with its tempered
    likelihood (reconstruction_weight); the tasks score with the model's likelihood whatever
    the mode, and leave the mode as it was."""
    torch.manual_seed(0)
    m = small_kvae(reconstruction_weight=0.3)
    x = (torch.rand(2, 5, 64) < 0.3).double()
    observed = torch.ones(2, 5, dtype=torch.bool)
    observed[:, 2] = False
    results = []
    for training in (True, False):
        m.train(training)
        pyro.set_rng_seed(3)
        results.append(impute(m, x, observed, method="importance", num_particles=8).probs)
        assert m.training == training
    assert torch.equal(results[0], results[1])


def test_float64_data_into_a_float32_model_is_converted():
    """Review defect: float64 data into a float32 model was a torch dtype error."""
    from pyro_seq.models import DMM

    m = DMM(3, z_dim=2, emission_dim=4, transition_dim=4, rnn_dim=4)
    x = (torch.rand(2, 4, 3) < 0.5).double()
    pyro.set_rng_seed(0)
    loss64 = pyro.infer.Trace_ELBO().loss(m.model, m.guide, x)
    pyro.set_rng_seed(0)
    loss32 = pyro.infer.Trace_ELBO().loss(m.model, m.guide, x.float())
    assert loss64 == loss32


def test_exact_evaluation_of_the_linear_gaussian_test_bed():
    """A latent-variable model that declares "exact" is evaluated by its closed form; with the
    exact smoothing guide, every one-sample ELBO equals it (q(z | x) = p(z | x))."""
    from pyro_seq.models import LinearGaussianSequenceModel
    from pyro_seq.train import evaluate_bound

    torch.manual_seed(0)
    model = LinearGaussianSequenceModel(2, 2, guide="smoothing").double()
    data = [torch.randn(T, 2, dtype=torch.float64) for T in (5, 3, 4)]
    exact = evaluate_bound(model, data, method="exact")
    x = torch.zeros(3, 5, 2, dtype=torch.float64)
    mask = torch.zeros(3, 5, dtype=torch.bool)
    for i, s in enumerate(data):
        x[i, : len(s)], mask[i, : len(s)] = s, True
    direct = float(model.exact_log_likelihood(x, mask, method="dense").sum())
    assert exact["total"] == pytest.approx(direct, rel=1e-10)
    assert exact["num_steps"] == 12
    elbo = evaluate_bound(model, data, method="elbo", num_particles=3)
    assert elbo["total"] == pytest.approx(exact["total"], rel=1e-9)
    assert "exact" in model.evaluation_methods and callable(model.exact_log_likelihood)
