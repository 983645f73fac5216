"""The five stages' names; they live in harness/names.py (torch-free) with the other names.

Kept as a re-export only because the report-rendering modules, rewritten in parallel, still
import from here; once they import harness.names this file can go.
"""

from harness.names import STAGES

__all__ = ["STAGES"]
