"""Whether saved weights solve the saved sums: a model file's second check after its checksum (a flipped bit, an
edited ``gamma`` under a fresh checksum), two matrix products and no factorisation."""

from __future__ import annotations

import math

import numpy as np

#: :func:`unsolved`'s tolerances, relative to the system's scale; a legitimate solve leaves about 1e-15.
RESIDUAL_TOLERANCE = 1e-9
GAMMA_TOLERANCE = 1e-9


def unsolved(W: np.ndarray, G: np.ndarray, Q: np.ndarray, gamma: float) -> str | None:
    """Why ``W`` does not solve ``(G + gamma I) W = Q``, or None where it does.

    Two checks in float64: the relative residual ``|(G + gamma I) W - Q| / (|G| |W| + gamma |W| + |Q|)`` (Frobenius
    norms), which a backward-stable solve keeps near 1e-15 however ill-conditioned; and the gamma that ``W`` implies,
    ``<Q - G W, W> / |W|^2``, against the stored one, to ``GAMMA_TOLERANCE (|G| + gamma)``: an edited gamma shows here
    first. ``G``, ``Q`` and gamma are taken times the power of two that brings a ``max|G|`` above 1 near 1 (exact, the
    same ``W``): the norms of sums near float64's range would overflow, and an infinite scale pass anything.
    """
    W, G, Q = (np.asarray(a, dtype=np.float64) for a in (W, G, Q))
    top = float(np.max(np.abs(G))) if G.size else 0.0
    shift = min(0, -math.frexp(top)[1]) if top < math.inf else 0  # down only: up, gamma and Q could overflow
    G, Q, stored, gamma = np.ldexp(G, shift), np.ldexp(Q, shift), gamma, math.ldexp(gamma, shift)
    GW = G @ W
    norm_g, norm_w, norm_q = (float(np.linalg.norm(a)) for a in (G, W, Q))
    residual = float(np.linalg.norm(GW + gamma * W - Q))
    scale = (norm_g + gamma) * norm_w + norm_q
    implied = float(np.vdot(Q - GW, W)) / norm_w**2 if norm_w else gamma
    if abs(implied - gamma) <= GAMMA_TOLERANCE * (norm_g + gamma) and residual <= RESIDUAL_TOLERANCE * scale:
        return None
    return (f"W does not solve (G + gamma I) W = Q for the stored gamma {stored:g} (relative residual "
            f"{residual / scale:.1e}; W implies gamma {math.ldexp(implied, -shift):.6g}): the file was altered")
