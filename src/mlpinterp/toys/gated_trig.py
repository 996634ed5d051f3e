"""Hand-coded gated piecewise-trigonometric residual MLP (Braun et al. 2025, App. C.1).

Input ``[batch, 1 + n_functions]``: a scalar ``x ~ U[0, 5]`` and control bits ``alpha_i ~ Bernoulli(0.05)``.
Target output ``[batch, 1]``: ``y = sum_i alpha_i F_i(x)`` with
``F_i(x) = a_i cos(b_i x + c_i) + d_i sin(e_i x + f_i) + g_i`` (coefficient ranges of the paper's table).

Construction. The residual stream is ``[x, alpha_0..alpha_{n-1}, y_hat]`` (``d_resid = n_functions + 2``).
Each function owns ``neurons_per_function`` neurons spread at random over the ``n_layers`` MLPs:
one constant neuron ``ReLU(alpha_i)`` writing ``F_i(0)`` and ramps ``ReLU(x - t_k + M (alpha_i - 1))`` with
knots ``t_k = 5 k / (neurons_per_function - 1)`` and gate constant ``M = 10 > max x``, writing the change of slope
of the linear interpolant of ``F_i`` at ``t_k``. With ``alpha_i = 1`` the ramps sum to the piecewise-linear
interpolant of ``F_i`` on the knots; with ``alpha_i = 0`` every neuron of function ``i`` is off. Each neuron is
monosemantic, so the ground-truth mechanism ``i`` is the set of weights (rows of ``mlp_in``, columns of
``mlp_out``) of function ``i``'s neurons in every layer.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from mlpinterp.toys.resid_mlp import MLPBlock
from mlpinterp.utils.validation import check_int, check_real

GATE_M = 10.0
X_RANGE = (0.0, 5.0)


class GatedTrigMLP(nn.Module):
    """Residual MLP ``[batch, 1 + n_functions] -> [batch, 1]`` (weights set by :func:`build_gated_trig`)."""

    def __init__(self, d_resid: int, d_mlp: int, n_layers: int, n_functions: int):
        super().__init__()
        for name, v in (("d_resid", d_resid), ("d_mlp", d_mlp), ("n_layers", n_layers), ("n_functions", n_functions)):
            check_int(v, name)
        if d_resid != n_functions + 2:
            raise ValueError(f"d_resid must be n_functions + 2 = {n_functions + 2}, got {d_resid}")
        self.d_resid, self.d_mlp, self.n_layers, self.n_functions = d_resid, d_mlp, n_layers, n_functions
        self.layers = nn.ModuleList([MLPBlock(d_resid, d_mlp) for _ in range(n_layers)])

    def embed(self, inp: torch.Tensor) -> torch.Tensor:
        """``[..., 1 + n_functions] -> [..., d_resid]``: append the (zero) output slot."""
        return torch.cat([inp, torch.zeros_like(inp[..., :1])], dim=-1)

    def readout_weight(self) -> torch.Tensor:
        """``[1, d_resid]`` selecting the last residual dimension (output = ``r @ W^T``)."""
        w = torch.zeros(1, self.d_resid, dtype=self.layers[0].mlp_in.weight.dtype)
        w[0, -1] = 1.0
        return w

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        if inp.ndim < 1 or inp.shape[-1] != 1 + self.n_functions:
            raise ValueError(f"inp must have shape [..., 1 + n_functions={1 + self.n_functions}], got {list(inp.shape)}")
        r = self.embed(inp)
        for layer in self.layers:
            r = r + layer(r)
        return r[..., -1:]

    def target_names(self) -> list[str]:
        """The ``nn.Linear`` modules to decompose."""
        return [f"layers.{i}.{n}" for i in range(self.n_layers) for n in ("mlp_in", "mlp_out")]


def trig_coefficients(n_functions: int, seed: int) -> np.ndarray:
    """``[n_functions, 7]`` coefficients ``(a, b, c, d, e, f, g)`` drawn from the paper's uniform ranges."""
    rng = np.random.default_rng(seed)
    lo = np.array([-1, 0.1, -math.pi, -1, 0.1, -math.pi, -1])
    hi = np.array([1, 1, math.pi, 1, 1, math.pi, 1])
    return rng.uniform(lo, hi, size=(n_functions, 7))


def trig_functions(x: np.ndarray | torch.Tensor, coeffs: np.ndarray) -> np.ndarray:
    """``F_i(x)`` for every function: ``[..., n_functions]`` (float64 numpy); ``coeffs``: ``[n_functions, 7]``."""
    coeffs = np.asarray(coeffs, dtype=np.float64)
    if coeffs.ndim != 2 or coeffs.shape[1] != 7:
        raise ValueError(f"coeffs must have shape [n_functions, 7] (a, b, c, d, e, f, g), got {list(coeffs.shape)}")
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().double().numpy()
    x = np.asarray(x, dtype=np.float64)
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(coeffs))):
        raise ValueError("x and coeffs must be finite (no NaN or inf)")
    x = x[..., None]
    a, b, c, d, e, f, g = (coeffs[:, j] for j in range(7))
    return a * np.cos(b * x + c) + d * np.sin(e * x + f) + g


def build_gated_trig(
    n_functions: int = 4, neurons_per_function: int = 10, n_layers: int = 2, seed: int = 0
) -> tuple[GatedTrigMLP, dict]:
    """Hand-code the network. Returns ``(model, info)`` with ``info["coefficients"]``, ``info["owner"]``
    (``[n_layers, d_mlp]`` function index of every neuron) and ``info["config"]`` (the four arguments, which define
    the network; targets saved before it was recorded hold ``seed`` and ``neurons_per_function`` only).

    Raises ``TypeError``/``ValueError`` for a non-int argument, a negative ``seed``, ``n_functions < 1``,
    ``neurons_per_function < 3``, ``n_layers < 1`` or neurons that do not split evenly over the layers."""
    for name, v in (("n_functions", n_functions), ("neurons_per_function", neurons_per_function),
                    ("n_layers", n_layers)):
        check_int(v, name, minimum=None)
    check_int(seed, "seed", minimum=0)
    if n_functions <= 0 or neurons_per_function < 3 or n_layers <= 0:
        raise ValueError("need n_functions >= 1, neurons_per_function >= 3, n_layers >= 1; got "
                         f"{n_functions}, {neurons_per_function}, {n_layers}")
    total = n_functions * neurons_per_function
    if total % n_layers:
        raise ValueError(f"n_functions * neurons_per_function = {total} must be divisible by n_layers={n_layers}")
    d_mlp, d_resid = total // n_layers, n_functions + 2
    coeffs = trig_coefficients(n_functions, seed)
    rng = np.random.default_rng(seed + 1)
    slots = rng.permutation(total)  # neuron slot of (function i, neuron k) = slots[i * npf + k]
    model = GatedTrigMLP(d_resid, d_mlp, n_layers, n_functions)
    owner = -np.ones((n_layers, d_mlp), dtype=np.int64)
    n_ramps = neurons_per_function - 1
    knots = np.linspace(*X_RANGE, n_ramps + 1)  # n_ramps segments, ramp k starts at knots[k]
    with torch.no_grad():
        for layer in model.layers:
            for p in layer.parameters():
                p.zero_()
        for i in range(n_functions):
            vals = trig_functions(knots, coeffs[i : i + 1])[:, 0]
            slopes = np.diff(vals) / np.diff(knots)
            delta = np.concatenate([[slopes[0]], np.diff(slopes)])  # change of slope at each ramp start
            for k in range(neurons_per_function):
                slot = int(slots[i * neurons_per_function + k])
                layer_idx, j = divmod(slot, d_mlp)
                owner[layer_idx, j] = i
                blk = model.layers[layer_idx]
                if k == 0:  # constant neuron: ReLU(alpha_i) * F_i(0)
                    blk.mlp_in.weight[j, 1 + i] = 1.0
                    blk.mlp_out.weight[-1, j] = float(vals[0])
                else:  # ramp: ReLU(x - t + M (alpha_i - 1))
                    blk.mlp_in.weight[j, 0] = 1.0
                    blk.mlp_in.weight[j, 1 + i] = GATE_M
                    blk.mlp_in.bias[j] = -float(knots[k - 1]) - GATE_M
                    blk.mlp_out.weight[-1, j] = float(delta[k - 1])
    config = {"n_functions": n_functions, "neurons_per_function": neurons_per_function, "n_layers": n_layers,
              "seed": seed}
    return model, {"coefficients": coeffs.tolist(), "owner": owner.tolist(), "seed": seed,
                   "neurons_per_function": neurons_per_function, "config": config}


def gated_trig_inputs(
    n: int, n_functions: int, p: float = 0.05, generator: torch.Generator | None = None
) -> torch.Tensor:
    """``[n, 1 + n_functions]``: ``x ~ U[0, 5]`` and Bernoulli(``p``) control bits."""
    check_int(n, "n")
    check_int(n_functions, "n_functions")
    check_real(p, "p", 0.0, 1.0)
    x = torch.rand(n, 1, generator=generator) * (X_RANGE[1] - X_RANGE[0]) + X_RANGE[0]
    bits = (torch.rand(n, n_functions, generator=generator) < p).float()
    return torch.cat([x, bits], dim=1)


def gated_trig_ground_truth(model: GatedTrigMLP) -> dict[str, torch.Tensor]:
    """Ground-truth component weights ``{name: [n_functions, d_out, d_in]}`` for every target Linear.

    A neuron belongs to function ``i`` when its ``mlp_in`` row reads control bit ``i``; component ``i`` keeps that
    neuron's ``mlp_in`` row and ``mlp_out`` column. The components sum to the weights exactly.
    """
    out: dict[str, torch.Tensor] = {}
    for l, blk in enumerate(model.layers):
        W_in, W_out = blk.mlp_in.weight.detach(), blk.mlp_out.weight.detach()
        owner = W_in[:, 1 : 1 + model.n_functions].abs().argmax(dim=1)
        used = W_in[:, 1 : 1 + model.n_functions].abs().amax(dim=1) > 0
        onehot = (torch.nn.functional.one_hot(owner, model.n_functions).T * used).to(W_in.dtype)  # [n_f, d_mlp]
        out[f"layers.{l}.mlp_in"] = onehot[:, :, None] * W_in[None]
        out[f"layers.{l}.mlp_out"] = onehot[:, None, :] * W_out[None]
    return out
