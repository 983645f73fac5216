"""From a command to runs: the options, the plan, the launchers, and series of runs (ablation, compare)."""
