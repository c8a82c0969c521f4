"""Random numbers and float32 weights that come out bit-identical on every machine.

The examples' sha256 values are pinned in ``examples/*.yaml``, so their bytes must
not depend on the CPU, its SIMD level, the BLAS, its thread count, the platform's
libm or the numpy release. Floating point cannot promise that beyond single
correctly rounded operations: a sum's rounding depends on its order (BLAS and SIMD
pick the order), ``exp``/``log`` differ between libms, and numpy's ``Generator``
keeps the right to change how it turns bits into distributions. So everything
here is integer arithmetic:

- the bits come from SplitMix64 over a counter, in wrapping uint64 arithmetic,
  keyed by a name: each tensor has its own stream, so the order in which tensors
  are drawn does not matter;
- distributions are built from those bits by shifts, multiplications and sums of
  integers;
- a float32 is made only from an integer of at most 24 significant bits times a
  power of two, which float32 represents exactly; wider integers are first
  rounded to 24 bits in integer arithmetic (``to_float32``).
"""

from __future__ import annotations

import hashlib
import math

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
FLOAT32_BITS = 24  # significand bits, the implicit one included


def random_uint64(key: str, count: int) -> np.ndarray:
    """``count`` uniform 64-bit words of SplitMix64 seeded from ``key``."""
    seed = np.uint64(int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little"))
    # Array arithmetic on uint64 wraps modulo 2**64, which is what SplitMix64 is defined with.
    z = np.arange(1, count + 1, dtype=np.uint64) * _GOLDEN + seed
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


def uniform_below(key: str, count: int, bound: int) -> np.ndarray:
    """``count`` integers uniform on ``[0, bound)`` as int64 (``bound`` up to 2**32).

    Multiply-shift on the top 32 bits: exact in uint64, and its bias (under
    ``bound / 2**32``) is far below anything these examples could notice.
    """
    if not 0 < bound <= 1 << 32:
        raise ValueError(f"bound must be in (0, 2**32], got {bound}")
    high = random_uint64(key, count) >> np.uint64(32)
    return ((high * np.uint64(bound)) >> np.uint64(32)).astype(np.int64)


def bell(key: str, shape: tuple[int, ...], width: int) -> np.ndarray:
    """Integers with a bell-shaped distribution around 0: the sum of four uniforms on ``[0, width)``, centred.

    Irwin-Hall with four terms is close to a normal (but bounded at about 3.5
    standard deviations); its variance is ``(width**2 - 1) / 3``. One 64-bit word
    gives the four 16-bit draws, so ``width`` is at most 2**16.
    """
    if not 1 < width <= 1 << 16:
        raise ValueError(f"width must be in (1, 2**16], got {width}")
    words = random_uint64(key, int(np.prod(shape, dtype=np.int64)))
    total = np.zeros(words.shape, np.int64)
    for part in range(4):
        chunk = (words >> np.uint64(16 * part)) & np.uint64(0xFFFF)
        total += ((chunk * np.uint64(width)) >> np.uint64(16)).astype(np.int64)
    return (total - 2 * (width - 1)).reshape(shape)


def bell_width(std: float, exponent: int) -> int:
    """The ``bell`` width whose values times ``2**-exponent`` have standard deviation closest to ``std``."""
    target = std * 2.0**exponent  # exact: scaling by a power of two
    # variance (w**2 - 1) / 3 = target**2. math.sqrt is correctly rounded (IEEE 754), so the same everywhere;
    # ``** 0.5`` would go through libm's pow.
    return round(math.sqrt(3.0 * target * target + 1.0))


def round_shift(values: np.ndarray, shift: int) -> np.ndarray:
    """``values / 2**shift`` rounded to the nearest integer (halves up), in int64; a negative shift multiplies."""
    if shift <= 0:
        return values << -shift
    return (values + (1 << (shift - 1))) >> shift


def to_float32(values: np.ndarray, exponent: int) -> np.ndarray:
    """``values * 2**-exponent`` as float32, with integers wider than 24 bits rounded to 24 (halves to even).

    The rounding is done on the integers, so the conversion that follows is exact
    whatever path numpy's cast takes (some go through float64 and would round
    twice).
    """
    ints = np.asarray(values, dtype=np.int64)
    magnitude = np.abs(ints)
    # Most arrays are already exact, and the rounding is the slow part for millions of weights.
    narrow = int(magnitude.max(initial=0)) < 1 << FLOAT32_BITS
    rounded = ints if narrow else _round_significand(ints, magnitude)
    # Exact: at most 24 significant bits, far inside float64's range; then an exact float64 -> float32 and a
    # multiplication by a power of two.
    return (rounded.astype(np.float64).astype(np.float32) * np.float32(2.0**-exponent)).astype(np.float32)


def _round_significand(ints: np.ndarray, magnitude: np.ndarray) -> np.ndarray:
    """``ints`` rounded to 24 significant bits, ties to even."""
    excess = np.maximum(_bit_length(magnitude) - FLOAT32_BITS, 0)
    unit = np.left_shift(np.int64(1), excess)
    quotient, remainder = np.divmod(magnitude, unit)
    half = unit >> 1
    up = (remainder > half) | ((remainder == half) & (excess > 0) & (quotient % 2 == 1))
    rounded: np.ndarray = np.sign(ints) * ((quotient + up) << excess)
    if int(np.max(_bit_length(np.abs(rounded)) - _trailing_zeros(rounded), initial=0)) > FLOAT32_BITS:
        raise AssertionError("rounding left more than 24 significant bits")  # a bug here, never the input
    return rounded


def _bit_length(magnitude: np.ndarray) -> np.ndarray:
    """Bit length of non-negative int64 values, in integer arithmetic (``np.log2`` would be libm)."""
    length = np.zeros(magnitude.shape, np.int64)
    rest = magnitude.copy()
    for step in (32, 16, 8, 4, 2, 1):
        big = rest >= (1 << step)
        length += np.where(big, step, 0)
        rest = np.where(big, rest >> step, rest)
    return length + (rest > 0)


def _trailing_zeros(values: np.ndarray) -> np.ndarray:
    """Trailing zero bits of int64 values (0 for 0, which has no significant bits to count)."""
    low = values & -values  # the lowest set bit
    return np.where(values == 0, 0, _bit_length(np.abs(low)) - 1)
