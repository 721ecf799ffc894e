"""The progress bar every long-running function of the package shows.

:func:`progress_bar` is ``tqdm.auto.tqdm`` (a widget in Jupyter) where the notebook widgets
(``ipywidgets``) are installed, and the text bar ``tqdm.std.tqdm`` elsewhere: ``tqdm.auto``
without ``ipywidgets`` warns (``TqdmWarning``) inside every notebook kernel, so a tutorial page
would print a warning and a path of the installation.
"""

import importlib.util
from typing import Any

__all__ = ["progress_bar"]


def progress_bar(*args: Any, **kwargs: Any) -> Any:
    """A ``tqdm`` progress bar (same arguments): the notebook widget where ``ipywidgets`` is
    installed, the text bar otherwise."""
    if importlib.util.find_spec("ipywidgets") is not None:
        from tqdm.auto import tqdm
    else:
        from tqdm.std import tqdm
    return tqdm(*args, **kwargs)
