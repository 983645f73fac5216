"""The run folder: its typed manifest, the JSON form of it, and the one writer of runs/."""
