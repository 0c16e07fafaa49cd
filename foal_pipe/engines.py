"""The two exact engines behind :class:`~foal_pipe.classifier.AnalyticClassifier`.

Both keep the ridge solution ``W = (H^T H + gamma I)^-1 H^T Y`` over every sample seen so far:

* :class:`RLSEngine` is the paper's recursive least squares (Theorems 3.1-3.2): per batch, a Woodbury
  update of ``R = (H^T H + gamma I)^-1`` and of ``W``. Cost O(D^2 S) per batch, every batch.
* :class:`GramEngine` accumulates ``G = H^T H`` and ``Q = H^T Y`` (order-free sums) and solves for ``W``
  only when the weights are asked for: O(D^2 S) per batch as one BLAS call, O(D^3) per solve.

Engines are written once against an array namespace ``xp`` (NumPy or CuPy).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from foal_pipe.errors import FoalPipeError


def ridge_solve(G: Any, Q: Any, gamma: float, xp: ModuleType) -> Any:
    """``(G + gamma I)^-1 Q``, the closed-form ridge solution from accumulated statistics."""
    A = G + gamma * xp.eye(G.shape[0], dtype=G.dtype)
    try:
        return xp.linalg.solve(A, Q)
    except np.linalg.LinAlgError:
        raise FoalPipeError(
            f"the ridge system is singular at gamma={gamma:g}; use a larger --gamma or --dtype float64"
        ) from None


def _pad_columns(matrix: Any, n_total: int, positions: np.ndarray, xp: ModuleType) -> Any:
    """Widen ``matrix`` to ``n_total`` columns, old columns moved to ``positions``, new ones zero."""
    out = xp.zeros((matrix.shape[0], n_total), dtype=matrix.dtype)
    out[:, xp.asarray(positions)] = matrix
    return out


class _Engine:
    name: str
    state_names: tuple[str, ...]
    class_columns: tuple[str, ...]

    def __init__(self, dim: int, gamma: float, xp: ModuleType, dtype: np.dtype) -> None:
        self.dim, self.gamma, self.xp, self.dtype = dim, gamma, xp, dtype

    def insert_classes(self, n_total: int, positions: np.ndarray) -> None:
        """Make room for new classes: zero columns wherever a new class sorts (exact, R/G are unchanged)."""
        for name in self.class_columns:
            setattr(self, name, _pad_columns(getattr(self, name), n_total, positions, self.xp))
        self._invalidate()

    def _invalidate(self) -> None:
        pass

    def state(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.state_names}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        for name in self.state_names:
            if name not in state:
                raise FoalPipeError(f"saved {self.name} state lacks the tensor {name!r}; save the model again")
            setattr(self, name, self.xp.asarray(state[name], dtype=self.dtype))
        self._invalidate()


class RLSEngine(_Engine):
    """The paper's per-batch recursive least squares; ``R0 = I / gamma``, ``W0 = 0``."""

    name = "rls"
    state_names = ("R", "W")
    class_columns = ("W",)

    def __init__(self, dim: int, gamma: float, xp: ModuleType, dtype: np.dtype) -> None:
        super().__init__(dim, gamma, xp, dtype)
        self.R = xp.eye(dim, dtype=dtype) / dtype.type(gamma)
        self.W = xp.zeros((dim, 0), dtype=dtype)

    def update(self, H: Any, Y: Any) -> None:
        """One Woodbury step: ``K = (I + H R H^T)^-1``, ``W += R H^T K (Y - H W)``, ``R -= R H^T K H R``."""
        xp = self.xp
        RHt = self.R @ H.T
        M = H @ RHt
        M[xp.diag_indices(M.shape[0])] += 1.0
        RHtK = xp.linalg.solve(M, RHt.T).T  # M is symmetric, so (M^-1 RHt^T)^T = RHt M^-1
        self.W += RHtK @ (Y - H @ self.W)
        self.R -= RHtK @ RHt.T

    def weights(self) -> Any:
        return self.W


class GramEngine(_Engine):
    """Accumulate ``G = H^T H`` and ``Q = H^T Y``; solve ``(G + gamma I) W = Q`` on demand."""

    name = "gram"
    state_names = ("G", "Q")
    class_columns = ("Q",)

    def __init__(self, dim: int, gamma: float, xp: ModuleType, dtype: np.dtype) -> None:
        super().__init__(dim, gamma, xp, dtype)
        self.G = xp.zeros((dim, dim), dtype=dtype)
        self.Q = xp.zeros((dim, 0), dtype=dtype)
        self._W: Any = None

    def _invalidate(self) -> None:
        self._W = None

    def update(self, H: Any, Y: Any) -> None:
        self.G += H.T @ H
        self.Q += H.T @ Y
        self._W = None

    def weights(self) -> Any:
        if self._W is None:
            self._W = ridge_solve(self.G, self.Q, self.gamma, self.xp)
        return self._W


ENGINES: dict[str, type[_Engine]] = {"gram": GramEngine, "rls": RLSEngine}
DEFAULT_ENGINE = "gram"
