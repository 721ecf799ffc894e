"""Helpers shared by the benchmark scripts: machine facts, JSON results, data paths."""

import json
import os
import platform
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def data_dirs():
    """Folders searched for data files, in order: those of ``$PYRO_SEQ_DATA`` (``os.pathsep``
    separated, as :func:`pyro_seq.data.load_dataset` reads it), then the development checkout's
    shared folder."""
    env = os.environ.get("PYRO_SEQ_DATA", "")
    dirs = [Path(d).expanduser() for d in env.split(os.pathsep) if d]
    return dirs + [ROOT.parent / "shared" / "data" / "polyphonic"]


#: the default ``--data-dir`` of the scripts: the first of :func:`data_dirs` that exists
SHARED_DATA = next((d for d in data_dirs() if d.is_dir()), data_dirs()[-1])


def machine_info():
    """Facts that a timing depends on: CPU, cores, threads, library versions."""
    import pyro

    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "pyro": pyro.__version__,
        "platform": platform.platform(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def device_info(device):
    """The device a run used: its name (the CPU model on a CPU run), memory, CUDA and cuDNN
    versions, and the peak memory the process allocated on it."""
    device = torch.device(device)
    info = {
        "device": str(device),
        "cuda_available": torch.cuda.is_available(),
        "torch_cuda": torch.version.cuda,
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(
            device_name=torch.cuda.get_device_name(device),
            device_memory_gib=round(props.total_memory / 2**30, 1),
            cudnn=torch.backends.cudnn.version(),
            max_memory_allocated_mib=round(torch.cuda.max_memory_allocated(device) / 2**20, 1),
        )
    else:
        info["device_name"] = machine_info()["cpu"]
    return info


def write_result(name, payload, path=None):
    """Write ``payload`` (plus machine facts) to ``benchmarks/results/<name>.json``, or to
    ``path`` when given (e.g. a smoke run that must not replace the recorded result)."""
    payload = dict(payload, machine=machine_info())
    path = Path(path) if path else RESULTS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1))
    print(f"wrote {path}")
    return path


def data_file(name, override=None):
    """Path of a data file (``override``, else the first of :func:`data_dirs` holding
    ``name``), or exit naming the file, the folders searched and how to point at it."""
    if override:
        path = Path(override)
        if not path.exists():
            raise SystemExit(f"data file {path} not found")
        return path
    for folder in data_dirs():
        if (folder / name).exists():
            return folder / name
    searched = ", ".join(str(d) for d in data_dirs())
    raise SystemExit(
        f"data file {name} not found in {searched}; set PYRO_SEQ_DATA to its folder or pass "
        "--data PATH"
    )


def timing_parser(description, repeats, batches_help, result_name, smoke_help, data_options):
    """The argument parser of the alternating-epoch speed scripts (``dmm_speed.py``,
    ``srnn_speed.py``): ``--repeats --batches --threads --seed --smoke --output`` plus
    ``data_options``, a list of ``(flag, help)`` string options."""
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--repeats", type=int, default=repeats, help="timed epochs per variant (median)"
    )
    parser.add_argument("--batches", type=int, default=None, help=batches_help)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    for flag, text in data_options:
        parser.add_argument(flag, default=None, help=text)
    parser.add_argument("--seed", type=int, default=0, help="seed of weights, noise, shuffles")
    parser.add_argument("--smoke", action="store_true", help=smoke_help)
    parser.add_argument(
        "--output",
        default=None,
        help=f"result JSON (default benchmarks/results/{result_name}.json; none in --smoke mode)",
    )
    return parser


def parse_timing_args(parser, argv=None):
    """Parse; ``--smoke`` means 1 repeat of 2 minibatches; counts must be >= 1."""
    args = parser.parse_args(argv)
    if args.smoke:
        args.repeats = 1
        args.batches = args.batches or 2
    if args.repeats < 1 or (args.batches is not None and args.batches < 1) or args.threads < 1:
        parser.error("--repeats, --batches and --threads must be >= 1")
    return args


def finish_timing(name, result, record, args):
    """End of a speed script: refuse non-finite training losses, then write ``result`` to
    ``benchmarks/results/<name>.json`` (or ``--output``; nothing in ``--smoke`` mode without it)."""
    import math

    if not all(math.isfinite(x) for v in record.values() for x in v["loss_per_step"]):
        raise SystemExit("a training loss was not finite")
    if args.smoke and args.output is None:
        print("smoke run: no result file written (pass --output PATH to keep one)")
    else:
        write_result(name, result, path=args.output)
    return result
