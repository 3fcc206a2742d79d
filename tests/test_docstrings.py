"""Every ``>>>`` example in tessel's docstrings runs and prints what it says (examples that need files or a
cluster are marked ``# doctest: +SKIP``)."""

import doctest
import importlib
import pkgutil

import pytest

import tessel

MODULES = sorted(m.name for m in pkgutil.walk_packages(tessel.__path__, "tessel.")
                 if not m.name.endswith("__main__"))  # importing __main__ runs the command line


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS, report=True)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {name} failed (printed above)"


def test_examples_were_found():
    found = sum(len(t.examples) for name in MODULES for t in doctest.DocTestFinder().find(
        importlib.import_module(name)))
    assert found > 50  # a finder that silently finds nothing would pass every test above
