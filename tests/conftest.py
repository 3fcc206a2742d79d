import compileall
import importlib.util

import pytest

from world import World


def pytest_configure(config):
    # Every launched worker imports tessel. Where bytecode is not written (PYTHONDONTWRITEBYTECODE, set here), each
    # would compile its source again: about a second of CPU a process, and a launch starts several.
    compileall.compile_dir(importlib.util.find_spec("tessel").submodule_search_locations[0], quiet=1)

_worlds: dict[int, World] = {}


def _get(size: int) -> World:
    w = _worlds.get(size)
    if w is None or w.broken:
        if w is not None:
            w.close()
        w = _worlds[size] = World(size)
    return w


@pytest.fixture
def world1() -> World:
    return _get(1)


@pytest.fixture
def world2() -> World:
    return _get(2)


@pytest.fixture
def world4() -> World:
    return _get(4)


@pytest.fixture
def world3() -> World:
    return _get(3)


@pytest.fixture
def world8() -> World:
    return _get(8)


def pytest_sessionfinish(session, exitstatus):
    for w in _worlds.values():
        w.close()
