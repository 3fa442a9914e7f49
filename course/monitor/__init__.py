"""Watching a run like ``nvidia-smi``: sampling (the history and its sampler), sources (NVML, rank CPU),
summary (what a history says), views (the live panel), summary_plot (after the run) and watch (all of it)."""
