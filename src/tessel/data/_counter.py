"""Counter-based randomness: random numbers as a pure function of integer keys.

A sample's contents depend only on (seed, sample index), never on which other samples were drawn
before it or in the same call. That is what lets any rank generate any slice of a global batch and
still agree bit for bit with a single process generating the whole batch.
"""

import numpy as np

from tessel.errors import DataError

_MASK64 = (1 << 64) - 1
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S11 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(11)
_TO_UNIT = 2.0**-53


def seed_key(seed: int) -> np.uint64:
    """Map any Python int (negative ones too) to a uint64 key."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise DataError(f"data seed {seed!r} is not an integer; give an int such as 0")
    return np.uint64(int(seed) & _MASK64)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser: a bijection on uint64 whose output bits all depend on every input bit."""
    # Wrap-around is the point of the arithmetic, not an accident.
    with np.errstate(over="ignore"):
        z = x + _GOLDEN
        z = (z ^ (z >> _S30)) * _MIX1
        z = (z ^ (z >> _S27)) * _MIX2
        return z ^ (z >> _S31)


def hash_keys(*keys) -> np.ndarray:
    """Hash broadcastable uint64 key arrays into one uint64 array.

    >>> hash_keys(np.uint64(1), np.arange(3, dtype=np.uint64)).shape
    (3,)
    """
    h = np.uint64(0)
    for key in keys:
        # Chaining mix(h ^ key) keeps key order significant: (a, b) and (b, a) hash differently.
        h = splitmix64(np.bitwise_xor(h, np.asarray(key, dtype=np.uint64)))
    return np.asarray(h, dtype=np.uint64)


def uniform(*keys) -> np.ndarray:
    """Uniform float64 in [0, 1), one per broadcast element of the keys (53 random bits each)."""
    return (hash_keys(*keys) >> _S11).astype(np.float64) * _TO_UNIT


def normal(*keys) -> np.ndarray:
    """Standard normal float64 per broadcast element of the keys (Box-Muller on two hashed uniforms)."""
    u1 = uniform(np.uint64(0x5EED0001), *keys)
    u2 = uniform(np.uint64(0x5EED0002), *keys)
    # 1 - u1 lies in (0, 1], so the log never sees zero.
    return np.sqrt(-2.0 * np.log1p(-u1)) * np.cos(2.0 * np.pi * u2)


def as_indices(indices, num_samples: int | None) -> np.ndarray:
    """Validate sample indices (array-like of ints) and return them as a 1-D int64 array."""
    arr = np.asarray(indices)
    if arr.ndim != 1:
        raise DataError(f"sample indices have shape {arr.shape}; give a 1-D array of sample indices")
    if arr.size == 0:
        return arr.astype(np.int64)
    if not np.issubdtype(arr.dtype, np.integer):
        raise DataError(f"sample indices have dtype {arr.dtype}; give integer indices")
    arr = arr.astype(np.int64)
    low, high = int(arr.min()), int(arr.max())
    if low < 0:
        raise DataError(f"sample index {low} is negative; indices start at 0")
    if num_samples is not None and high >= num_samples:
        raise DataError(f"sample index {high} is out of range; this dataset has {num_samples} samples")
    return arr
