"""The fence around private Pyro and ``torch.distributions`` names (``pyro_seq.pyro_internals``).

(a) Every private name the fence uses still exists where the fence reads it, and means what the
fence assumes (checked on small Pyro objects against Pyro's own public functions or closed
forms); a release that moves one fails here with a message naming the name and the version.
(b) An AST scan of ``pyro_seq/**/*.py``: private Pyro names appear only in the fence (and in the
allow-listed files that issue 24's ops split has still to route).
"""

import ast
import importlib
from pathlib import Path

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine
from pyro.infer.util import check_fully_reparametrized

from pyro_seq import pyro_internals as fence

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "pyro_seq"
FENCE = "pyro_seq/pyro_internals.py"


def moved(owner, name):
    package, version = (
        ("torch", torch.__version__)
        if owner.startswith("torch")
        else ("pyro-ppl", pyro.__version__)
    )
    return f"{package} {version} moved {owner}.{name}: update {FENCE}"


# ---------------------------------------------------------------------------------------------
# (a) the private names the fence uses


def _masked():
    return dist.Normal(torch.zeros(3), 1.0).mask(torch.tensor([True, False, True]))


def _hmm():
    return _gaussian_hmm()[0]


def _elbo():
    return pyro.infer.Trace_ELBO(num_particles=4, vectorize_particles=True, max_plate_nesting=1)


#: (owner, name, factory): ``name`` is read on ``factory()`` (an instance attribute), or on the
#: class or module ``owner`` when ``factory`` is None. Every private name of the fence is here
#: (test_the_fence_checks_every_private_name_it_uses).
PRIVATE_NAMES = [
    ("pyro.poutine.runtime", "_PYRO_STACK", None),
    ("pyro.poutine.subsample_messenger", "_Subsample", None),
    ("torch.distributions.Distribution", "_validate_args", None),
    ("pyro.distributions.torch_distribution.MaskedDistribution", "_mask", _masked),
    ("pyro.distributions.GaussianHMM", "_init", _hmm),
    ("pyro.distributions.GaussianHMM", "_trans", _hmm),
    ("pyro.distributions.GaussianHMM", "_obs", _hmm),
    ("pyro.infer.elbo.ELBO", "_vectorized_num_particles", None),
]

#: Protected names the package relies on as the documented way to subclass (not routed: a
#: subclass overrides or calls its own): ELBO trace hooks, Distribution helpers, Messenger
#: dispatch.
SUBCLASS_HOOKS = [
    ("pyro.infer.elbo.ELBO", "_get_trace"),
    ("pyro.infer.elbo.ELBO", "_get_traces"),
    ("torch.distributions.Distribution", "_extended_shape"),
    ("torch.distributions.Distribution", "_get_checked_instance"),
    ("pyro.poutine.messenger.Messenger", "_process_message"),
    ("pyro.poutine.messenger.Messenger", "_postprocess_message"),
]


def _resolve(dotted):
    """The object ``dotted`` names: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for part in parts[i:]:
            obj = getattr(obj, part)
        return obj
    raise ImportError(dotted)


@pytest.mark.parametrize(
    "owner,name,factory", PRIVATE_NAMES, ids=[f"{o}.{n}" for o, n, _ in PRIVATE_NAMES]
)
def test_private_name_still_exists(owner, name, factory):
    try:
        holder = factory() if factory is not None else _resolve(owner)
    except (ImportError, AttributeError) as e:
        pytest.fail(f"{moved(owner, name)} ({owner} itself is gone: {e})")
    if not hasattr(holder, name):
        pytest.fail(moved(owner, name))


@pytest.mark.parametrize("owner,name", SUBCLASS_HOOKS, ids=[f"{o}.{n}" for o, n in SUBCLASS_HOOKS])
def test_subclass_hook_still_exists(owner, name):
    if not callable(getattr(_resolve(owner), name, None)):
        pytest.fail(f"{moved(owner, name)} (a subclass hook that pyro_seq overrides or calls)")


def test_value_preserving_messengers_import_from_their_modules():
    """The hand-kept list is nine handler classes, each importable from its Pyro module."""
    assert len(fence.VALUE_PRESERVING_MESSENGERS) == 9
    for cls in fence.VALUE_PRESERVING_MESSENGERS:
        module = importlib.import_module(cls.__module__)
        assert getattr(module, cls.__name__, None) is cls, moved(cls.__module__, cls.__name__)


def test_active_messengers_is_the_handler_stack_outermost_first():
    assert fence.active_messengers() == ()
    with poutine.trace() as tr, poutine.block() as bl:
        assert fence.active_messengers() == (tr, bl), moved("pyro.poutine.runtime", "_PYRO_STACK")
        with poutine.scale(scale=2.0) as sc:
            assert fence.active_messengers() == (tr, bl, sc)
    assert fence.active_messengers() == ()


def test_preserves_sample_values():
    class Declares(poutine.messenger.Messenger):
        preserves_sample_values = True

    assert fence.preserves_sample_values(poutine.trace())
    assert fence.preserves_sample_values(pyro.plate("p", 3))
    assert fence.preserves_sample_values(Declares())
    assert not fence.preserves_sample_values(poutine.messenger.Messenger())
    assert not fence.preserves_sample_values(poutine.condition(data={}))
    assert not fence.preserves_sample_values(poutine.replay(trace=poutine.Trace()))


def test_is_subsample_finds_exactly_the_plate_subsample_site():
    def model():
        with pyro.plate("data", 10, subsample_size=3):
            pyro.sample("z", dist.Normal(0.0, 1.0))

    trace = poutine.trace(model).get_trace()
    found = [name for name, site in trace.nodes.items() if fence.is_subsample(site)]
    assert found == ["data"], moved("pyro.poutine.subsample_messenger", "_Subsample")
    assert type(trace.nodes["data"]["fn"]).__name__ == "_Subsample"
    assert trace.nodes["data"]["value"].shape == (3,)


def test_default_validate_args_is_what_a_new_distribution_checks():
    before = fence.default_validate_args()
    try:
        for flag in (False, True):
            torch.distributions.Distribution.set_default_validate_args(flag)
            assert fence.default_validate_args() is flag
            assert dist.Normal(0.0, 1.0)._validate_args is flag
    finally:
        torch.distributions.Distribution.set_default_validate_args(before)


def test_masked_distribution_mask_is_the_mask_given():
    m = torch.tensor([True, False, True])
    fn = dist.Normal(torch.zeros(3), 1.0).mask(m)
    assert fence.masked_distribution_mask(fn) is m
    assert fence.masked_distribution_mask(dist.Normal(0.0, 1.0).mask(False)) is False
    with pytest.raises(TypeError, match="MaskedDistribution"):
        fence.masked_distribution_mask(dist.Normal(0.0, 1.0))


def _gaussian_hmm():
    g = torch.Generator().manual_seed(0)
    S, D = 2, 3

    def spd(n):
        a = torch.randn(n, n, generator=g, dtype=torch.float64)
        return a @ a.T + n * torch.eye(n, dtype=torch.float64)

    mu0, P0 = torch.randn(S, generator=g, dtype=torch.float64), spd(S)
    A, Q = torch.randn(S, S, generator=g, dtype=torch.float64), spd(S)
    C, R = torch.randn(S, D, generator=g, dtype=torch.float64), spd(D)
    b, d = (
        torch.randn(S, generator=g, dtype=torch.float64),
        torch.randn(D, generator=g, dtype=torch.float64),
    )
    hmm = dist.GaussianHMM(
        dist.MultivariateNormal(mu0, P0),
        A,
        dist.MultivariateNormal(b, Q),
        C,
        dist.MultivariateNormal(d, R),
        duration=4,
    )
    return hmm, (mu0, P0, A, Q, b, C, R, d)


def test_gaussian_hmm_factors_hold_the_model():
    """The factors in information form give back the parameters: the initial Gaussian's
    moments, and each conditional y = x @ M + N(loc, cov) of the transition and observation
    factors (cov = P_yy^{-1}, M^T = -cov P_yx, loc = cov info_y)."""
    hmm, (mu0, P0, A, Q, b, C, R, d) = _gaussian_hmm()
    init, trans, obs = fence.gaussian_hmm_factors(hmm)
    cov0 = torch.linalg.inv(init.precision)
    torch.testing.assert_close(cov0, P0, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(cov0 @ init.info_vec, mu0, rtol=1e-10, atol=1e-10)
    for factor, M, loc, cov in ((trans, A, b, Q), (obs, C, d, R)):
        S = M.shape[0]
        P = factor.precision
        c = torch.linalg.inv(P[S:, S:])
        torch.testing.assert_close(c, cov, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(-c @ P[S:, :S], M.T, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(c @ factor.info_vec[S:], loc, rtol=1e-10, atol=1e-10)
    with pytest.raises(TypeError, match="GaussianHMM"):
        fence.gaussian_hmm_factors(dist.Normal(0.0, 1.0))


def test_vectorized_num_particles_adds_the_particle_plate():
    def model():
        return pyro.sample("z", dist.Normal(0.0, 1.0))

    trace = poutine.trace(fence.vectorized_num_particles(_elbo(), model)).get_trace()
    site = trace.nodes["z"]
    assert site["value"].shape == (4, 1)  # the particle plate at dim -2 (max_plate_nesting=1)
    assert [(f.name, f.size, f.dim) for f in site["cond_indep_stack"]] == [
        ("num_particles_vectorized", 4, -2)
    ]


def test_is_particle_plate_recognises_the_elbos_plate_only():
    seen = []

    def model():
        seen.append([fence.is_particle_plate(m) for m in fence.active_messengers()])
        with pyro.plate(fence.PARTICLE_PLATE_NAME + "_not", 2, dim=-1):
            seen.append([fence.is_particle_plate(m) for m in fence.active_messengers()])

    fence.vectorized_num_particles(_elbo(), model)()
    assert seen == [[True], [True, False]]  # the ELBO's plate, not another plate
    model()
    assert seen[2:] == [[], [False]]


class _AddsScoreFunction(dist.Normal):
    """Reparameterised, but its own score_parts adds a score-function term (as Rejector)."""

    def score_parts(self, value):
        parts = super().score_parts(value)
        return parts._replace(score_function=parts.log_prob)


def test_is_reparameterized_agrees_with_pyros_check():
    """On traced guide sites (score parts computed) the fence's test accepts exactly the sites
    Pyro's check_fully_reparametrized accepts; without score parts it is ``has_rsample``."""

    def guide():
        pyro.sample("normal", dist.Normal(torch.zeros(2), 1.0).to_event(1))
        pyro.sample("masked", dist.Normal(torch.zeros(2), 1.0).mask(torch.tensor([True, False])))
        pyro.sample("bernoulli", dist.Bernoulli(0.3))
        pyro.sample("categorical", dist.Categorical(torch.ones(3)).mask(False))
        pyro.sample("score_fn", _AddsScoreFunction(0.0, 1.0))
        with pyro.plate("p", 5, subsample_size=2):
            pyro.sample("in_plate", dist.Normal(0.0, 1.0))

    trace = poutine.trace(guide).get_trace()
    trace.compute_score_parts()
    verdicts = {}
    for name, site in trace.nodes.items():
        if site["type"] != "sample" or fence.is_subsample(site):
            continue
        try:
            check_fully_reparametrized(site)
            expected = True
        except NotImplementedError:
            expected = False
        verdicts[name] = fence.is_reparameterized(site)
        assert verdicts[name] is expected, name
        bare = {key: value for key, value in site.items() if key != "score_parts"}
        assert fence.is_reparameterized(bare) is bool(site["fn"].has_rsample), name
    assert verdicts == {
        "normal": True,
        "masked": True,
        "bernoulli": False,
        "categorical": False,
        "score_fn": False,
        "in_plate": True,
    }


def test_messenger_dispatch_calls_the_sample_hooks():
    """pyro_seq's messengers define ``_pyro_sample``/``_pyro_post_sample``; Pyro calls them."""
    seen = []

    class Fix(poutine.messenger.Messenger):
        def _pyro_sample(self, msg):
            msg["value"] = torch.tensor(7.0)

        def _pyro_post_sample(self, msg):
            seen.append(msg["name"])

    with Fix():
        value = pyro.sample("z", dist.Normal(0.0, 1.0))
    assert float(value) == 7.0 and seen == ["z"]


# ---------------------------------------------------------------------------------------------
# (b) private names only in the fence

#: Private Pyro names, flagged wherever they appear (names, attributes, imports, strings).
ALWAYS_PRIVATE = {"_PYRO_STACK", "_Subsample", "_vectorized_num_particles", "_get_vectorized_trace"}
#: Private attributes of Pyro / torch.distributions objects: flagged on any receiver but ``self``
#: (a distribution's own ``self._validate_args`` is torch's subclass protocol, and ``expand``
#: sets it on the new instance it builds: ``new._validate_args = ...`` is allowed).
FOREIGN_ATTRIBUTES = {"_validate_args", "_mask", "_init", "_trans", "_obs"}
#: Modules whose ``_``-prefixed names are private to Pyro or torch.distributions.
PRIVATE_ROOTS = ("pyro", "torch.distributions")

ALLOWED = {}


def _under_private_root(dotted):
    return any(dotted == r or dotted.startswith(r + ".") for r in PRIVATE_ROOTS)


def _private(part):
    return part.startswith("_") and not part.startswith("__")


def _dotted(node):
    """``a.b.c`` for a chain of attributes on a name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id] + parts[::-1])


def private_uses(source):
    """``[(line, name, text)]``: each use of a private Pyro name in ``source`` (rules above)."""
    tree = ast.parse(source)
    origin = {}  # local name -> dotted origin, for names bound by imports
    hits = []

    def hit(node, name):
        hits.append((node.lineno, name, ast.get_source_segment(source, node) or name))

    def check_path(node, dotted):  # a private part below a private root
        parts = dotted.split(".")
        for i, part in enumerate(parts):
            if _private(part) and _under_private_root(".".join(parts[:i])):
                hit(node, part)
                return True
        return False

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                top = a.name.split(".")[0]
                origin[a.asname or top] = a.name if a.asname else top
                check_path(node, a.name)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                origin[a.asname or a.name] = f"{node.module}.{a.name}"
                if not check_path(node, f"{node.module}.{a.name}") and a.name in ALWAYS_PRIVATE:
                    hit(node, a.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in ALWAYS_PRIVATE:
            hit(node, node.id)
        elif isinstance(node, ast.Constant) and node.value in ALWAYS_PRIVATE:
            hit(node, node.value)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
            and len(node.args) > 1
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in FOREIGN_ATTRIBUTES
            and not (isinstance(node.args[0], ast.Name) and node.args[0].id == "self")
        ):
            hit(node, node.args[1].value)
        elif isinstance(node, ast.Attribute):
            chain = _dotted(node)
            root, _, rest = (chain or "").partition(".")
            if chain is not None and root in origin and check_path(node, f"{origin[root]}.{rest}"):
                continue
            receiver = node.value
            on_self = isinstance(receiver, ast.Name) and receiver.id == "self"
            if node.attr in ALWAYS_PRIVATE:
                hit(node, node.attr)
            elif node.attr in FOREIGN_ATTRIBUTES and not on_self:
                expand_protocol = (
                    node.attr == "_validate_args"
                    and isinstance(node.ctx, ast.Store)
                    and isinstance(receiver, ast.Name)
                    and receiver.id not in origin
                )
                if not expand_protocol:
                    hit(node, node.attr)
    return sorted(set(hits))


def _package_files():
    return sorted(p for p in PACKAGE.rglob("*.py"))


def _rel(path):
    return path.relative_to(ROOT).as_posix()


def test_private_pyro_names_appear_only_in_the_fence():
    offending = []
    for path in _package_files():
        rel = _rel(path)
        if rel == FENCE:
            continue
        for line, name, text in private_uses(path.read_text()):
            if name not in ALLOWED.get(rel, set()):
                offending.append(f"{rel}:{line}: {text}")
    assert not offending, (
        "private Pyro/torch.distributions names outside "
        + FENCE
        + " (add a function there and call it): "
        + "; ".join(offending)
    )


def test_every_allow_list_entry_is_still_needed():
    for rel, names in ALLOWED.items():
        path = ROOT / rel
        used = {name for _, name, _ in private_uses(path.read_text())} if path.exists() else set()
        assert names <= used, (
            f"{rel} no longer uses {sorted(names - used)}: remove them from "
            "ALLOWED in tests/test_pyro_fence.py"
        )


def test_the_fence_checks_every_private_name_it_uses():
    used = {name for _, name, _ in private_uses((ROOT / FENCE).read_text())}
    checked = {name for _, name, _ in PRIVATE_NAMES}
    assert used, "the scan finds nothing in the fence: the scan is broken"
    assert used <= checked, f"{FENCE} uses {sorted(used - checked)}, which PRIVATE_NAMES lacks"


@pytest.mark.parametrize(
    "source,names",
    [
        ("from pyro.poutine.runtime import _PYRO_STACK\n", ["_PYRO_STACK"]),
        ("import pyro\nx = pyro.poutine.runtime._PYRO_STACK\n", ["_PYRO_STACK"]),
        ("from pyro import poutine\nx = poutine.runtime._PYRO_STACK\n", ["_PYRO_STACK"]),
        ("ok = type(fn).__name__ == '_Subsample'\n", ["_Subsample"]),
        ("import torch\nv = torch.distributions.Distribution._validate_args\n", ["_validate_args"]),
        (
            "from torch.distributions import Distribution\nv = Distribution._validate_args\n",
            ["_validate_args"],
        ),
        (
            "from torch.distributions import Distribution\nDistribution._validate_args = False\n",
            ["_validate_args"],
        ),
        ("v = fn._validate_args\n", ["_validate_args"]),
        ("v = getattr(fn, '_validate_args')\n", ["_validate_args"]),
        ("m = fn._mask\n", ["_mask"]),
        ("a, b = hmm._init, hmm._trans\n", ["_init", "_trans"]),
        ("f = self._vectorized_num_particles(model)\n", ["_vectorized_num_particles"]),
        ("from pyro.infer.util import _private_helper\n", ["_private_helper"]),
        ("from pyro.ops._hidden import thing\n", ["_hidden"]),
        # allowed: a distribution's own flag, expand's new instance, public names under an alias
        (
            "class D:\n    def f(self):\n        new._validate_args = self._validate_args\n"
            "        return self._validate_args and self._mask\n",
            [],
        ),
        ("from pyro.optim.clipped_adam import ClippedAdam as _TorchClippedAdam\n", []),
        ("from pyro.poutine.util import site_is_subsample\n", []),
        ("x = super()._get_traces(model, guide, args, kwargs)\n", []),
        ('"""A plate emits a ``_Subsample`` site."""\n', []),
    ],
)
def test_the_scan_flags_private_names(source, names):
    assert sorted(name for _, name, _ in private_uses(source)) == sorted(names)


def test_the_call_sites_refuse_a_bernoulli_guide_as_before():
    """FreeBits_ELBO (under validation) and IWAE's DReG estimator refuse a guide site without
    rsample, each with the exception and message it had before the checks shared
    :func:`pyro_seq.pyro_internals.is_reparameterized` (FIVO's: tests/infer/test_fivo.py); a
    Normal guide passes."""
    from pyro_seq.infer import IWAE, FreeBits_ELBO

    def model(x):
        z = pyro.sample("z", dist.Normal(0.0, 1.0))
        pyro.sample("x", dist.Normal(z, 1.0), obs=x)

    def bernoulli_guide(x):
        pyro.sample("z", dist.Bernoulli(0.5))

    def normal_guide(x):
        pyro.sample("z", dist.Normal(pyro.param("m", torch.tensor(0.1)), 1.0))

    x = torch.tensor(0.3)
    pyro.clear_param_store()
    with pyro.validation_enabled(True):
        with pytest.raises(
            NotImplementedError,
            match="All distributions in the guide must be fully reparameterized",
        ):
            FreeBits_ELBO(free_bits=0.0).loss(model, bernoulli_guide, x)
    assert torch.isfinite(torch.tensor(FreeBits_ELBO(free_bits=0.0).loss(model, normal_guide, x)))
    with pytest.raises(
        ValueError,
        match=r"IWAE\(gradient_estimator='dreg'\) needs a fully "
        r"reparameterized guide, but guide site 'z' "
        r"\(Bernoulli\)",
    ):
        IWAE(num_particles=3, gradient_estimator="dreg").loss_and_grads(model, bernoulli_guide, x)
    IWAE(num_particles=3, gradient_estimator="dreg").loss_and_grads(model, normal_guide, x)
