"""Torch modules computing polynomial approximants (for gradient-based analyses and GPU evaluation)."""

from __future__ import annotations

import torch
import torch.nn as nn


def _hermite_stack(z: torch.Tensor, n: int) -> torch.Tensor:
    """He_0..He_n of ``z`` stacked on a new last axis (three-term recurrence)."""
    hs = [torch.ones_like(z)]
    if n >= 1:
        hs.append(z)
    for k in range(1, n):
        hs.append(z * hs[k] - k * hs[k - 1])
    return torch.stack(hs, dim=-1)


class RidgePolynomialModule(nn.Module):
    """``RidgePolynomial`` as a module: ``[batch, d_in] -> [batch, d_out]`` (buffers, no parameters)."""

    def __init__(self, p):
        """``p``: a :class:`~mlpinterp.poly.approximant.RidgePolynomial` (its ``state()`` arrays become buffers)."""
        super().__init__()
        for k, v in p.state().items():
            self.register_buffer(k, torch.from_numpy(v.copy()))
        self.degree = p.degree
        self.gated = p.G is not None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xc = x.to(self.A.dtype) - self.center
        He = _hermite_stack(xc @ self.A.T, self.degree)
        h = (He * self.D).sum(-1)
        if self.gated and self.degree >= 1:
            h = h + (xc @ self.G.T) * (He[..., : self.degree] * self.E).sum(-1)
        return h @ self.W2.T + self.b2


class DensePolynomialModule(nn.Module):
    """``DensePolynomial`` as a module: ``[batch, d_in] -> [batch, d_out]``."""

    def __init__(self, p):
        """``p``: a :class:`~mlpinterp.poly.approximant.DensePolynomial` (its coefficient tensors become buffers)."""
        super().__init__()
        self.degree = p.degree
        for k, T in enumerate(p.tensors):
            self.register_buffer(f"T{k}", torch.from_numpy(T.copy()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.T0.dtype)
        out = self.T0.expand(x.shape[0], -1)
        for k in range(1, self.degree + 1):
            Y = getattr(self, f"T{k}")
            Y = torch.einsum("o...a,na->no...", Y, x)
            for _ in range(k - 1):
                Y = torch.einsum("no...a,na->no...", Y, x)
            out = out + Y
        return out
