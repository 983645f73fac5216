"""Loading csrc/'s extensions (model/extensions.py): a built one loads; a missing one is one line
that says which it is and the command that builds it."""

from __future__ import annotations

import pytest

from model.extensions import extension


def test_a_built_extension_loads_and_a_missing_one_names_make_ext():
    assert hasattr(extension("model._row_init", "row init"), "init_values")
    with pytest.raises(ImportError, match=r"^the shadow table extension is not built \(.*\); run `make ext`$") as exc:
        extension("model._shadow_table", "shadow table")
    assert "\n" not in str(exc.value)
