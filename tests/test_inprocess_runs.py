"""The suite's own in-process pytester runs see every edit a test makes to a
project between runs (tests/conftest.py's `_no_bytecode_in_projects`)."""

from __future__ import annotations

import os

import pytest


def test_a_same_size_edit_within_the_same_second_is_what_the_next_run_imports(pytester: pytest.Pytester):
    module = pytester.path / "test_value.py"
    module.write_text("VALUE = 1\n\ndef test_value():\n    assert VALUE == 1\n")
    assert pytester.runpytest_inprocess("-p", "no:cacheprovider").ret == 0
    stamp = module.stat()
    module.write_text("VALUE = 2\n\ndef test_value():\n    assert VALUE == 1\n")  # same size
    os.utime(module, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))  # and the same mtime
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    assert result.ret == 1, "the run imported the module as it was before the edit"
