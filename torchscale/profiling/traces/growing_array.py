"""A column that a reader appends blocks to (see :class:`GrowingArray`)."""

from __future__ import annotations

from typing import Dict

import numpy as np


class GrowingArray:
    """A column that blocks are appended to: one array grown by doubling.

    Not a list of per-block arrays: those (each under a megabyte) come from the C heap, and a
    heap that held a 10M-event trace in small pieces stays that large after they are joined and
    freed. One large array is mapped and returned whole; its unused capacity is never touched,
    so it costs address space, not memory. The type widens when a block needs it.
    """

    def __init__(self) -> None:
        self._data = np.zeros(0, dtype=np.int8)
        self._size = 0

    def append(self, values: np.ndarray) -> None:
        need = self._size + len(values)
        kind = np.result_type(self._data.dtype, values.dtype) if self._size else values.dtype
        if need > len(self._data) or kind != self._data.dtype:
            grown = np.empty(max(need, 2 * len(self._data), 1 << 16), dtype=kind)
            grown[: self._size] = self._data[: self._size]
            self._data = grown
        self._data[self._size : need] = values
        self._size = need

    def array(self) -> np.ndarray:
        """The values (a view: the capacity beyond them is never touched)."""
        return self._data[: self._size]

    def take(self) -> np.ndarray:
        """The values, leaving this empty."""
        out = self.array()
        self._data, self._size = np.zeros(0, dtype=np.int8), 0
        return out

    def __len__(self) -> int:
        return self._size

    @property
    def nbytes(self) -> int:
        return self._size * self._data.itemsize

    def __getstate__(self) -> Dict[str, object]:  # parse workers send only the values
        return {"_data": np.array(self.array()), "_size": self._size}
