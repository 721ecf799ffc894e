"""Tests of the documentation: the Sphinx build, the API coverage, the equations index and the design-page example."""
