"""Counter-based randomness for masking: a pure hash of ``(seed, epoch, example_id, position, stream)``.

Not a stateful generator: masks are reproducible, independent of batch composition, worker count and world
size, new every epoch, and different across ranks and workers because those see different examples. One
implementation, on ``uint32`` NumPy arrays, whose multiplication wraps mod 2**32 natively; tensors go in and
out through the small torch wrappers below.
"""

from __future__ import annotations

import numpy as np
import torch

_M32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9  # offsets the epoch so that epoch 0 does not hash to the seed's own key
_POSITION_SALT = 0x632BE5AB


def mix32(x: np.ndarray) -> np.ndarray:
    """lowbias32, a 32-bit integer finalizer with good avalanche, on ``uint32`` arrays (a new array)."""
    x = x ^ (x >> np.uint32(16))
    x *= np.uint32(0x7FEB352D)
    x ^= x >> np.uint32(15)
    x *= np.uint32(0x846CA68B)
    x ^= x >> np.uint32(16)
    return x


def key_array(keys: torch.Tensor) -> np.ndarray:
    """Keys as the ``uint32`` array :func:`uniform_np` takes (convert once, draw many streams)."""
    return (keys.cpu().numpy().astype(np.int64) & _M32).astype(np.uint32)


def _to_tensor(keys: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(keys.astype(np.int64)).to(like.device)


def example_keys(seed: int, epoch: torch.Tensor, example_id: torch.Tensor) -> torch.Tensor:
    """One 32-bit key per example (as int64) from the seed, the epoch and the example's index."""
    ids = example_id.cpu().numpy().astype(np.int64)
    low, high = (ids & _M32).astype(np.uint32), ((ids >> 32) & _M32).astype(np.uint32)
    epoch_key = mix32(((epoch.cpu().numpy().astype(np.int64) + _GOLDEN) & _M32).astype(np.uint32))
    key = mix32(np.full(len(ids), seed & _M32, dtype=np.uint32) ^ epoch_key)
    return _to_tensor(mix32(mix32(key ^ low) ^ high), example_id)


def derive_keys(keys: torch.Tensor, salt: int) -> torch.Tensor:
    """Independent per-example keys for another purpose (e.g. span lengths), from ``keys`` and a salt."""
    return _to_tensor(mix32(key_array(keys) ^ np.uint32(salt & _M32)), keys)


def uniform_np(keys: np.ndarray, n: int, stream: int) -> np.ndarray:
    """``(B, n)`` float32 in [0, 1): a function of each ``uint32`` key, the position and the stream.

    Values are multiples of 2**-24 (the hash's top 24 bits), exact in float32.
    """
    return uniform_at_np(keys[:, None], np.arange(n, dtype=np.uint32)[None, :], stream)


def uniform_at_np(keys: np.ndarray, positions: np.ndarray, stream: int) -> np.ndarray:
    """:func:`uniform_np` at given ``(key, position)`` pairs only (arrays that broadcast): the same values,
    for when a few positions of a batch need a draw."""
    salted = positions.astype(np.uint32) * np.uint32(4) + np.uint32((stream + _POSITION_SALT) & _M32)
    h = mix32(keys ^ mix32(salted))
    return (h >> np.uint32(8)).astype(np.float32) * np.float32(1.0 / (1 << 24))


def uniform(keys: torch.Tensor, n: int, stream: int) -> torch.Tensor:
    """:func:`uniform_np` for a tensor of keys (as returned by :func:`example_keys`)."""
    return torch.from_numpy(uniform_np(key_array(keys), n, stream)).to(keys.device)
