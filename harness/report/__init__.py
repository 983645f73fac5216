"""Reports from run folders: readers (load) and renderers. Imports no runtime (harness.run)."""
