"""The command line's argument types: ``argparse`` ``type=`` range checks (the names that
:class:`~pyro_seq.train.TrainConfig` fields declare as their ``check``)."""

import argparse
from typing import Callable, Optional, Type, Union


def number(
    kind: Union[Type[int], Type[float]],
    low: float,
    high: Optional[float] = None,
    low_open: bool = False,
    high_open: bool = False,
) -> Callable[[str], float]:
    """An argparse ``type=``: a finite ``kind`` (int or float) in the interval from ``low`` to
    ``high`` (open at an end when ``low_open`` / ``high_open``). argparse refuses anything else
    with the usage line and one error line naming the option and the range (exit code 2)."""
    import math

    noun = "a whole number" if kind is int else "a number"
    if high is None:
        if kind is int and not low_open:
            rng = f">= {low}"
        else:
            rng = f"{'>' if low_open else '>='} {low}"
    else:
        rng = f"in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {noun} {rng}, got {text!r}") from None
        if (
            not math.isfinite(value)
            or value < low
            or (low_open and value == low)
            or (high is not None and (value > high or (high_open and value == high)))
        ):
            raise argparse.ArgumentTypeError(f"must be {noun} {rng}, got {text}")
        return value

    parse.__name__ = f"{noun} {rng}"
    return parse


POSITIVE_INT = number(int, 1)
COUNT = number(int, 0)
AT_LEAST_TWO = number(int, 2)
SEED = number(int, 0, 2**63 - 1)
POSITIVE = number(float, 0, low_open=True)
NON_NEGATIVE = number(float, 0)
AT_LEAST_ONE = number(float, 1)
PROBABILITY = number(float, 0, 1)
PROBABILITY_BELOW_ONE = number(float, 0, 1, high_open=True)
FRACTION = number(float, 0, 1, low_open=True, high_open=True)
