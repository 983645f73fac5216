"""Where batches come from: the synthetic Criteo-shaped stream or the MLPerf files."""
