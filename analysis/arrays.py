"""The typed array of the analysis: float64, indexed by turn, bin or time.

Why: numpy's stubs type arithmetic on a bare `np.ndarray` (any dtype) as Any, so a function that
returns such an expression has no checked type at all; with the dtype named, the stubs carry
float64 through the arithmetic and mypy checks what the function returns.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
