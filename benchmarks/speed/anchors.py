"""Run Pyro's unchanged ``examples/dmm.py`` offline, loaded by path, as a timing anchor.

The anchor files live outside the project, in ``../shared/anchors/pyro-1.9.2/`` relative to the
repository root (``examples_dmm.py`` and ``polyphonic_data_loader.py`` of Pyro 1.9.2; see the
README there). Nothing of them is copied into the project. What this module does:

1. Reads the source of the example's data loader (``pyro/contrib/examples/
   polyphonic_data_loader.py``) and makes exactly two edits to the text, each of which must
   match once (so a different anchor fails loudly instead of running half-patched):

   * the download ``pickle.load(urlopen(dataset.url))`` becomes a read of the file of the same
     name in ``data_dir`` (``jsb_chorales.pickle``), through the package's restricted unpickler
     :func:`pyro_seq.data.safe_pickle.safe_load` (same objects as ``pickle.load`` on that file,
     without executing anything a pickle names);
   * ``from pyro.contrib.examples.util import get_data_directory`` (that module needs
     torchvision) becomes a function returning a temporary folder, where the loader caches its
     processed data.

   Everything else (processing, ``load_data``, ``get_mini_batch`` with its sorting, reversal,
   masks and packing) is the anchor's code, compiled under the anchor's own file name.
2. Registers that module as ``pyro.contrib.examples.polyphonic_data_loader`` in
   ``sys.modules`` while ``examples_dmm.py`` is imported by path with :mod:`importlib` (not as
   ``__main__``, so its argparse block, which asserts Pyro 1.9.1, does not run); the previous
   entry is restored afterwards (the example keeps its reference as ``poly``).
3. Builds the training step as the example's ``main()`` does with its default options: reads
   those defaults from the ``parser.add_argument`` calls of its ``__main__`` block (with
   :mod:`ast`, without running it) and calls the example's own ``DMM``, ``ClippedAdam``,
   ``Trace_ELBO`` and ``SVI`` with them (the default branch: no ``--jit``, ``--tmc``,
   ``--tmcelbo``).

:func:`copy_weights` maps the example's parameters onto :class:`pyro_seq.models.DMM` (same
networks, different names) and :func:`replayed_elbo` scores both with the same latent samples,
so the benchmark can check that it times two implementations of one function.
"""

import argparse
import ast
import functools
import hashlib
import importlib.util
import os
import sys
import tempfile
import types
from pathlib import Path

sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py

import pyro.poutine as poutine
import torch
from pyro.poutine.util import site_is_subsample

ROOT = Path(__file__).resolve().parents[2]
ANCHORS = ROOT.parent / "shared" / "anchors" / "pyro-1.9.2"
DMM_FILE = "examples_dmm.py"
LOADER_FILE = "polyphonic_data_loader.py"
LOADER_MODULE = "pyro.contrib.examples.polyphonic_data_loader"

#: The only edits made to the loader's source: (exact text, replacement). Each must occur once.
LOADER_EDITS = (
    ("pickle.load(urlopen(dataset.url))", "_anchor_read_pickle(dataset.url)"),
    (
        "from pyro.contrib.examples.util import get_data_directory",
        "get_data_directory = _anchor_get_data_directory",
    ),
)


class AnchorMissing(FileNotFoundError):
    """The anchor files or the data they need are not where they were looked for."""


def anchor_dir(override=None):
    """The folder holding ``examples_dmm.py`` and ``polyphonic_data_loader.py``.

    ``override`` may name that folder or the anchors root above it (``.../anchors``).
    Raises :class:`AnchorMissing` with the paths tried when the files are absent.
    """
    base = Path(override) if override else ANCHORS
    tried = [base] if base.name == ANCHORS.name else [base, base / ANCHORS.name]
    for folder in tried:
        if (folder / DMM_FILE).is_file() and (folder / LOADER_FILE).is_file():
            return folder.resolve()
    raise AnchorMissing(
        f"anchor files {DMM_FILE} and {LOADER_FILE} not found in {' or '.join(map(str, tried))}; "
        f"they are Pyro 1.9.2's examples/dmm.py and its data loader, kept outside the project "
        f"in ../shared/anchors/pyro-1.9.2/ -- pass --anchors DIR"
    )


def _file_digest(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _edited_loader_source(path):
    source = Path(path).read_text()
    for old, new in LOADER_EDITS:
        count = source.count(old)
        if count != 1:
            raise RuntimeError(
                f"{path}: expected exactly one {old!r} to replace, found {count}; "
                "this runner was written for Pyro 1.9.2's loader"
            )
        source = source.replace(old, new)
    return source


def _main_defaults(path):
    """``argparse.Namespace`` of the defaults that the ``__main__`` block of ``path`` declares.

    Every ``parser.add_argument(...)`` call there gives one entry, named as argparse would
    (the first long option, dashes to underscores); ``action="store_true"`` defaults to False.
    """
    tree = ast.parse(Path(path).read_text(), str(path))
    main_blocks = [
        node
        for node in tree.body
        if isinstance(node, ast.If)
        and isinstance(node.test, ast.Compare)
        and isinstance(node.test.left, ast.Name)
        and node.test.left.id == "__name__"
    ]
    if len(main_blocks) != 1:
        raise RuntimeError(f"{path}: expected one `if __name__ == '__main__'` block")
    defaults = {}
    for node in ast.walk(main_blocks[0]):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_argument"
        ):
            continue
        options = [a.value for a in node.args if isinstance(a, ast.Constant)]
        longs = [o for o in options if o.startswith("--")]
        dest = (longs or options)[0].lstrip("-").replace("-", "_")
        keywords = {k.arg: k.value for k in node.keywords}
        if "default" in keywords:
            defaults[dest] = ast.literal_eval(keywords["default"])
        elif "action" in keywords and ast.literal_eval(keywords["action"]) == "store_true":
            defaults[dest] = False
        else:
            defaults[dest] = None
    return argparse.Namespace(**defaults)


class Anchor:
    """Pyro's ``examples/dmm.py`` loaded offline (see the module docstring).

    :ivar module: the imported example (``module.DMM``, ``module.poly``, ...).
    :ivar poly: its data loader (the edited ``polyphonic_data_loader``).
    :ivar defaults: ``argparse.Namespace`` of the example's command-line defaults.
    :ivar folder: where the anchor files were read.
    :ivar digests: sha256 of each anchor file, for the record.
    """

    def __init__(self, folder, data_dir):
        self.folder = Path(folder)
        self.data_dir = Path(data_dir)
        self._tmp = tempfile.TemporaryDirectory(prefix="pyro_anchor_data_")
        self.digests = {name: _file_digest(self.folder / name) for name in (DMM_FILE, LOADER_FILE)}
        self.poly = self._load_loader()
        self.module = self._load_example()
        self.defaults = _main_defaults(self.folder / DMM_FILE)
        self._data = None

    def _read_pickle(self, url):
        from pyro_seq.data.safe_pickle import safe_load

        path = self.data_dir / os.path.basename(url)
        if not path.is_file():
            raise AnchorMissing(
                f"{path} not found (the anchor's loader would download {url}); pass --data-dir DIR"
            )
        return safe_load(path)

    def _load_loader(self):
        path = self.folder / LOADER_FILE
        module = types.ModuleType(LOADER_MODULE)
        module.__file__ = str(path)
        module._anchor_read_pickle = self._read_pickle
        module._anchor_get_data_directory = lambda _file: self._tmp.name
        exec(compile(_edited_loader_source(path), str(path), "exec"), module.__dict__)
        return module

    def _load_example(self):
        path = self.folder / DMM_FILE
        spec = importlib.util.spec_from_file_location("pyro_anchor_examples_dmm", path)
        module = importlib.util.module_from_spec(spec)
        # the parent packages, as a real import of the loader would have imported them (the
        # example binds ``poly`` through ``pyro.contrib.examples``); their __init__ files are empty
        importlib.import_module(LOADER_MODULE.rpartition(".")[0])
        missing = object()
        previous = sys.modules.get(LOADER_MODULE, missing)
        sys.modules[LOADER_MODULE] = self.poly
        try:
            spec.loader.exec_module(module)
        finally:
            if previous is missing:
                del sys.modules[LOADER_MODULE]
            else:
                sys.modules[LOADER_MODULE] = previous
        if module.poly is not self.poly:
            raise RuntimeError(f"{path} did not pick up the offline data loader")
        return module

    def data(self):
        """The example's ``poly.load_data(poly.JSB_CHORALES)`` (processed once, then cached)."""
        if self._data is None:
            self._data = self.poly.load_data(self.poly.JSB_CHORALES)
        return self._data

    def adam_params(self):
        """ClippedAdam settings of the example's ``main()`` with its default options."""
        a = self.defaults
        return {
            "lr": a.learning_rate,
            "betas": (a.beta1, a.beta2),
            "clip_norm": a.clip_norm,
            "lrd": a.lr_decay,
            "weight_decay": a.weight_decay,
        }

    def make_svi(self):
        """``(dmm, svi)`` built as the example's ``main()`` builds them with default options."""
        a, m = self.defaults, self.module
        if a.jit or a.tmc or a.tmcelbo:
            raise RuntimeError("the anchor's defaults select JIT/TMC; this runner times Trace_ELBO")
        dmm = m.DMM(
            rnn_dropout_rate=a.rnn_dropout_rate,
            num_iafs=a.num_iafs,
            iaf_dim=a.iaf_dim,
            use_cuda=False,
        )
        svi = m.SVI(dmm.model, dmm.guide, m.ClippedAdam(self.adam_params()), loss=m.Trace_ELBO())
        return dmm, svi

    def mini_batch(self, indices):
        """The example's ``poly.get_mini_batch`` on training sequences ``indices``: ``(mini_batch,
        mini_batch_reversed, mini_batch_mask, mini_batch_seq_lengths)``, sorted by length."""
        train = self.data()["train"]
        return self.poly.get_mini_batch(
            torch.as_tensor(indices, dtype=torch.long),
            train["sequences"],
            train["sequence_lengths"],
        )

    def training_sequences(self):
        """The example's training sequences, each ``(T_i, 88)``, in file order."""
        train = self.data()["train"]
        return [s[:n] for s, n in zip(train["sequences"], train["sequence_lengths"].tolist())]


@functools.lru_cache(maxsize=None)
def _load(folder, data_dir):
    return Anchor(folder, data_dir)


def load_anchor(anchors=None, data_dir=None):
    """The :class:`Anchor` from ``anchors`` (default ``../shared/anchors/pyro-1.9.2``) with data
    from ``data_dir`` (default the shared polyphonic folder); loaded once per process."""
    from common import SHARED_DATA

    folder = anchor_dir(anchors)
    data_dir = Path(data_dir) if data_dir else SHARED_DATA
    if not (data_dir / "jsb_chorales.pickle").is_file():
        raise AnchorMissing(f"{data_dir / 'jsb_chorales.pickle'} not found; pass --data-dir DIR")
    return _load(str(folder), str(data_dir.resolve()))


# ---------------------------------------------------------------------------------------------
# The example's DMM and pyro_seq.models.DMM: same networks, different parameter names.

#: example module prefix -> pyro_seq.models.DMM prefix
DMM_NAME_MAP = {
    "z_0": "z_0",
    "z_q_0": "z_q_0",
    "h_0": "encoder.h0",  # (1, 1, rnn_dim) -> (rnn_dim,)
    "rnn.": "encoder.rnn.",  # ReLU nn.RNN, same weight names
    "emitter.lin_z_to_hidden.": "emitter.0.",
    "emitter.lin_hidden_to_hidden.": "emitter.2.",
    "emitter.lin_hidden_to_input.": "emitter.4.",  # sigmoid(.) there, logits here
    "trans.lin_gate_z_to_hidden.": "transition.gate_hidden.",
    "trans.lin_gate_hidden_to_z.": "transition.gate.",
    "trans.lin_proposed_mean_z_to_hidden.": "transition.proposal_hidden.",
    "trans.lin_proposed_mean_hidden_to_z.": "transition.proposal.",
    "trans.lin_sig.": "transition.raw_scale.",
    "trans.lin_z_to_loc.": "transition.linear.",
    "combiner.lin_z_to_hidden.": "combiner.z_to_hidden.",
    "combiner.lin_hidden_to_loc.": "combiner.loc.",
    "combiner.lin_hidden_to_scale.": "combiner.raw_scale.",
}


def pyro_seq_name(name):
    """The :class:`pyro_seq.models.DMM` parameter that example parameter ``name`` maps to."""
    for prefix, target in DMM_NAME_MAP.items():
        if name == prefix or (prefix.endswith(".") and name.startswith(prefix)):
            return target + name[len(prefix) :]
    raise KeyError(f"no pyro_seq.models.DMM parameter for the example's {name!r}")


@torch.no_grad()
def copy_weights(example_dmm, ours):
    """Copy every parameter of the example's ``DMM`` into ``ours`` (a ``pyro_seq.models.DMM`` of
    the same sizes, ``inference="smoothing"``, ``rnn_cell="rnn"``, Bernoulli likelihood).

    The map is checked to be one-to-one and onto both parameter sets with matching numbers of
    elements, so a renamed or added parameter on either side raises instead of being skipped.
    """
    src = dict(example_dmm.named_parameters())
    dst = dict(ours.named_parameters())
    mapped = {pyro_seq_name(k): k for k in src}
    if len(mapped) != len(src) or set(mapped) != set(dst):
        no_target = sorted(v for k, v in mapped.items() if k not in dst)
        raise RuntimeError(
            f"parameter map is not one-to-one onto pyro_seq's parameters: example "
            f"parameters with no target {no_target}, pyro_seq parameters never "
            f"written {sorted(set(dst) - set(mapped))}"
        )
    for ours_name, example_name in mapped.items():
        s, d = src[example_name], dst[ours_name]
        if s.numel() != d.numel():
            raise RuntimeError(f"{example_name} {tuple(s.shape)} vs {ours_name} {tuple(d.shape)}")
        d.copy_(s.reshape(d.shape))


def replayed_elbo(example_dmm, ours, batch):
    """Per-site log-densities of both DMMs on one minibatch with the *same* latent samples.

    Samples ``z_1..z_T`` once from the example's guide, then scores the example's model and the
    package's guide and model against those values (``poutine.replay``; latent sites have the
    same names ``z_t`` in both, observations are ``obs_x_t`` there and ``x_t`` here). With the
    weights of :func:`copy_weights` and ``min_scale=0`` the two single-sample ELBOs
    ``log p(x, z) - log q(z | x)`` are then the same number up to float rounding.

    :param batch: the example's minibatch tuple (:meth:`Anchor.mini_batch`); the package sees
        ``(mini_batch, mini_batch_mask.bool())`` in the same (length-sorted) order.
    :returns: dict with ``"example"`` and ``"pyro_seq"`` entries, each a dict
        ``{"model": {site: log_prob_sum}, "guide": {site: log_prob_sum}, "elbo": float}``, sites
        keyed by the package's names.
    """
    x, mask = batch[0], batch[2].bool()
    with torch.no_grad():
        guide_tr = poutine.trace(example_dmm.guide).get_trace(*batch)
        traces = {
            "example": (
                poutine.trace(poutine.replay(example_dmm.model, trace=guide_tr)).get_trace(*batch),
                guide_tr,
            ),
            "pyro_seq": (
                poutine.trace(poutine.replay(ours.model, trace=guide_tr)).get_trace(x, mask),
                poutine.trace(poutine.replay(ours.guide, trace=guide_tr)).get_trace(x, mask),
            ),
        }
    out = {}
    for key, (model_tr, g_tr) in traces.items():
        terms = {}
        for role, tr in (("model", model_tr), ("guide", g_tr)):
            tr.compute_log_prob()
            terms[role] = {
                name.replace("obs_x_", "x_"): float(site["log_prob_sum"])
                for name, site in tr.nodes.items()
                if site["type"] == "sample" and not site_is_subsample(site)
            }
        terms["elbo"] = sum(terms["model"].values()) - sum(terms["guide"].values())
        out[key] = terms
    return out


def compare_elbos(scores):
    """Summary of :func:`replayed_elbo`: both ELBOs, their difference, the largest per-site
    difference and the sum of absolute site terms (the scale of float32 rounding)."""
    a, b = scores["example"], scores["pyro_seq"]
    worst, scale = 0.0, 0.0
    for role in ("model", "guide"):
        if set(a[role]) != set(b[role]):
            raise RuntimeError(f"{role} sites differ: {sorted(set(a[role]) ^ set(b[role]))[:6]}")
        for site, value in a[role].items():
            worst = max(worst, abs(value - b[role][site]))
            scale += abs(value)
    return {
        "elbo_example": a["elbo"],
        "elbo_pyro_seq": b["elbo"],
        "elbo_abs_diff": abs(a["elbo"] - b["elbo"]),
        "max_site_abs_diff": worst,
        "sum_abs_site_terms": scale,
        "num_sites": len(a["model"]) + len(a["guide"]),
    }


def pyro_seq_twin(example_dmm, obs_dim=88):
    """A ``pyro_seq.models.DMM`` with the example's sizes and weights and ``min_scale=0`` (the
    example has no floor on its scales): the same function as ``example_dmm``."""
    from pyro_seq.models import DMM

    sizes = {
        "z_dim": example_dmm.z_0.numel(),
        "rnn_dim": example_dmm.rnn.hidden_size,
        "transition_dim": example_dmm.trans.lin_gate_z_to_hidden.out_features,
        "emission_dim": example_dmm.emitter.lin_z_to_hidden.out_features,
    }
    ours = DMM(obs_dim, min_scale=0.0, **sizes)
    ours.module_name = "pyro_seq_dmm_twin"  # keep its parameters apart from the example's "dmm"
    copy_weights(example_dmm, ours)
    return ours


__all__ = [
    "ANCHORS",
    "Anchor",
    "AnchorMissing",
    "DMM_NAME_MAP",
    "anchor_dir",
    "compare_elbos",
    "copy_weights",
    "load_anchor",
    "pyro_seq_name",
    "pyro_seq_twin",
    "replayed_elbo",
]
