"""Sphinx configuration: API pages are generated from the docstrings."""

import os
import sys

sys.path.insert(0, os.path.abspath(".."))

project = "pyro-seq"
author = "pyro-seq developers"
extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.mathjax",
              "sphinx.ext.viewcode"]
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "show-inheritance": True}
html_theme = "alabaster"
exclude_patterns = ["_build"]
