"""Reference implementations used only as timing baselines in the benchmarks."""
