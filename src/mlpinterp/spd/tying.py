"""How the optimiser sees a tied pair of SPD sites (``SPDConfig.tied_updates``).

TMS's ``linear1`` = ``W`` and ``linear2`` = ``W^T`` are decomposed with one set of subcomponents, ``linear2``'s the
transposes of ``linear1``'s (``SPDConfig.tied``). Two ways to train that one set (:data:`TIED_UPDATES`):

- ``"summed"``: the tied site has no factors of its own (:class:`mlpinterp.paramspace.Components` with ``tied``); the
  gradients of both uses add up on the source's factors and Adam makes **one** update from one state.
- ``"separate"`` (:class:`SeparatelyTiedComponents`): the SPD reference implementation's way. Its ``run_spd.py``
  (``optimize``, at the paper's commit ``f8de8aad`` and at ``3f0bb61e``, Feb 2026) sets
  ``tgt.U.data = src.V.data.T`` and ``tgt.V.data = src.U.data.T``: the tied module keeps its own ``Parameter``
  objects, over the source's storage, and both sets go to the optimiser. Each use then has its own gradient and its
  own Adam moments, and every step adds **two** Adam updates to the shared values (and, in the faithfulness
  warm-up's AdamW, applies the weight decay twice). Here the tied site's factors are likewise ``Parameter`` views
  of the source's (transposed), re-pointed after every ``.to()``; they are left out of the state dict (a saved
  decomposition has the same tensors in both modes) and filled from the source's on load.

One difference from the reference remains in ``"separate"`` on the CPU: PyTorch's AdamW there updates one
parameter at a time, so in the warm-up (weight decay 0.1) the second view's decay also scales the first view's update
(a relative difference of ``lr * weight_decay`` = 1e-3 on that one term per warm-up step), where the multi-tensor
implementation, PyTorch's default on a GPU (the reference's runs, and ours with ``device="cuda"``), decays both views
before adding either update. The main loop's Adam has no weight decay, so there the two orders agree exactly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from mlpinterp.paramspace.components import Components, Site

TIED_UPDATES = ("summed", "separate")
"""``SPDConfig.tied_updates``: ``"summed"`` (one parameter, the gradients of both uses summed, one Adam update) or
``"separate"`` (the SPD reference's: two parameters over one storage, two Adam states and updates)."""


def _key(name: str) -> str:
    return name.replace(".", "__")


class SeparatelyTiedComponents(Components):
    """:class:`~mlpinterp.paramspace.Components` whose tied sites own ``Parameter`` views of their source's factors.

    ``tied_A[site] = B[source]^T`` and ``tied_B[site] = A[source]^T`` share the source's storage (values equal at
    all times) but are separate autograd leaves and separate optimiser parameters. Same arguments and errors as
    :class:`~mlpinterp.paramspace.Components`.
    """

    def __init__(self, sites: Sequence[Site], C: int, m=None, init_scale: float = 1.0,
                 generator: torch.Generator | None = None, init: str = "scaled", instances: int = 3,
                 tied: Mapping[str, str] | None = None):
        super().__init__(sites, C, m=m, init_scale=init_scale, generator=generator, init=init, instances=instances,
                         tied=tied)
        self.tied_A = nn.ParameterDict()
        self.tied_B = nn.ParameterDict()
        self._retie()
        self.register_state_dict_post_hook(_drop_views)
        self.register_load_state_dict_post_hook(_forgive_views)

    def _retie(self) -> None:
        """Point every tied site's parameters at its source's current storage (transposed)."""
        for dst, src in self.tied.items():
            A, B = super().factors(src)
            k = _key(dst)
            if k in self.tied_A:
                self.tied_A[k].data = B.data.transpose(1, 2)
                self.tied_B[k].data = A.data.transpose(1, 2)
            else:
                self.tied_A[k] = nn.Parameter(B.data.transpose(1, 2))
                self.tied_B[k] = nn.Parameter(A.data.transpose(1, 2))

    def _apply(self, fn, recurse: bool = True):
        out = super()._apply(fn, recurse)
        self._retie()  # .to(device / dtype) converts every parameter on its own: share the storage again
        return out

    def factors(self, site: Site | str) -> tuple[torch.Tensor, torch.Tensor]:
        """``(A, B)`` of ``site``: ``[C, d_out, m]`` and ``[C, m, d_in]``; a tied site's own parameter views."""
        name = site.name if isinstance(site, Site) else site
        if isinstance(name, str) and name in self.tied:
            return self.tied_A[_key(name)], self.tied_B[_key(name)]
        return super().factors(site)


def _drop_views(module: SeparatelyTiedComponents, state: dict, prefix: str, local_metadata) -> None:
    for k in [k for k in state if k.startswith((prefix + "tied_A.", prefix + "tied_B."))]:
        del state[k]


def _forgive_views(module: SeparatelyTiedComponents, incompatible) -> None:
    # the views are filled by loading their source's tensors; a state dict never holds them
    incompatible.missing_keys[:] = [k for k in incompatible.missing_keys if ".tied_A." not in f".{k}"
                                    and ".tied_B." not in f".{k}"]
