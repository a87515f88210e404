"""Dispersive loss: a regulariser that spreads the features of a batch apart.

Each sample's features are flattened to ``h_i`` in R^D; the loss runs over the ``P = B (B - 1)`` ordered pairs
``i != j`` of a distance ``d_ij``:

- ``infonce_l2``:     ``d_ij = ||h_i - h_j||^2 / D``, ``L = log( (1/P) sum_{i!=j} exp(-d_ij / tau) + eps )``
- ``infonce_cosine``: ``d_ij = 1 - <h_i, h_j> / (||h_i|| ||h_j||)`` (norms clamped at 1e-12), same ``L``
- ``infonce_cosine_centred``: the same on ``h_i - mean_batch(h)``. The uncentred cosine of non-negative features
  (after a ReLU or a sigmoid gate) is lowered only by disjoint sparse supports, which gates reach by shrinking
  towards zero; centred, neither scale nor a common offset can lower it
- ``hinge``:          ``d_ij = ||h_i - h_j|| / sqrt(D)``, ``L = (1/P) sum_{i!=j} max(0, margin - d_ij)^2``
- ``covariance``:     ``H~ = H - mean_batch(H)``, ``C = H~^T H~ / (B - 1)``,
  ``L = sum_{p!=q} C_pq^2 / (D (D - 1))`` (the off-diagonal mean; 0 when D = 1)

The 1/D is the original Dispersive Loss's (Wang & He, 2025): without it ``exp(-d / tau)`` underflows for large D and
the loss has no gradient. The covariance penalty is a mean for the same reason: the paper's sum (Eq. 6) grows with
``D^2``, a sum divided by D still with D; for features of equal per-dimension statistics only the mean keeps one
value (and one weight) whatever the layer's size. Like the sum it grows with the 4th power of the feature scale, so
when ``D >> B`` (``C`` has rank < B and cannot be diagonal) shrinking the features lowers it too. All is computed
in fp32 (autocast off) from the B x B Gram matrix, so D may be 10^6 without a D x D matrix.
"""
import math
from types import MappingProxyType
from typing import Dict, Mapping, Tuple

import torch
from torch import Tensor, nn

from nnunetv2_meddisseg.losses.gather import gather_batch

__all__ = ["DISPERSIVE_VARIANTS", "DISPERSIVE_PLACEMENTS", "DIAGNOSTIC_KEYS", "DIAGNOSTICS_BLOCK_ELEMENTS",
           "MINIMUM_BATCH", "dispersive_loss", "DispersiveLoss", "dispersion_diagnostics"]

DISPERSIVE_VARIANTS: Tuple[str, ...] = ("infonce_l2", "infonce_cosine", "infonce_cosine_centred", "hinge",
                                         "covariance")
DISPERSIVE_PLACEMENTS: Tuple[str, ...] = ("early", "middle", "late")
#: the smallest batch (samples dispersed together) with a gradient; 3 for ``infonce_cosine_centred``: centred, two
#: samples are exact opposites (cosine distance 2), so at B = 2 the loss is the constant ``log(exp(-2 / tau) + eps)``
MINIMUM_BATCH: Mapping[str, int] = MappingProxyType({v: 3 if v == "infonce_cosine_centred" else 2
                                                     for v in DISPERSIVE_VARIANTS})
#: the keys of ``dispersion_diagnostics``
DIAGNOSTIC_KEYS: Tuple[str, ...] = ("mean_pairwise_distance", "effective_rank")
#: feature values ``dispersion_diagnostics`` converts to float64 at a time (8 MiB)
DIAGNOSTICS_BLOCK_ELEMENTS = 2 ** 20

_FP32 = torch.finfo(torch.float32)
_NORM_CLAMP = 1e-12


def _check_options(variant: str, tau: float, eps: float, margin: float) -> None:
    if variant not in DISPERSIVE_VARIANTS:
        raise ValueError(f"dispersive loss: unknown variant {variant!r}, expected one of {DISPERSIVE_VARIANTS}")
    if not (math.isfinite(tau) and tau > 0):
        raise ValueError(f"dispersive loss: tau must be a finite number > 0, got tau={tau!r}")
    if not (math.isfinite(eps) and eps >= 0):
        raise ValueError(f"dispersive loss: eps must be a finite number >= 0, got eps={eps!r}")
    if not (math.isfinite(margin) and margin >= 0):
        raise ValueError(f"dispersive loss: margin must be a finite number >= 0, got margin={margin!r}")


def _off_diagonal(m: Tensor) -> Tensor:
    """m: (B, B) -> (B (B - 1),) entries i != j, row by row, without a boolean mask (its data-dependent size breaks
    torch.compile's graph): after the first element, the flattened matrix has rows of B + 1 ending on a diagonal."""
    b = m.shape[0]
    return m.flatten()[1:].view(b - 1, b + 1)[:, :b].reshape(-1)


def _safe_sqrt(x: Tensor) -> Tensor:
    """sqrt with a zero (not infinite) gradient at 0."""
    positive = x > 0
    return torch.where(positive, torch.sqrt(torch.where(positive, x, torch.ones_like(x))), torch.zeros_like(x))


def dispersive_loss(features: Tensor, variant: str = "infonce_l2", tau: float = 0.8, eps: float = 1e-8,
                    margin: float = 1.0) -> Tensor:
    """Dispersive loss (module docstring) of features (B, ...) of any float dtype, flattened to (B, D) -> 0-dim fp32;
    with B < 2 a zero still connected to the graph. Value and gradient are finite for finite input; ``covariance`` (4th
    power of the feature scale) must fit in fp32."""
    _check_options(variant, tau, eps, margin)
    return _dispersive(features, variant, tau, eps, margin)


def _dispersive(features: Tensor, variant: str, tau: float, eps: float, margin: float) -> Tensor:
    """``dispersive_loss`` of options already checked (``DispersiveLoss`` checks them once)."""
    if features.ndim < 1:
        raise ValueError(f"dispersive loss: features must have a batch dimension, got shape {tuple(features.shape)}")
    h = features.float().reshape(features.shape[0], -1)  # (B, D) fp32
    b = h.shape[0]
    if b < 2:
        return (h * 0.0).sum()
    with torch.autocast(device_type=h.device.type, enabled=False):
        d = h.shape[1]
        if variant in ("infonce_cosine", "infonce_cosine_centred"):
            if variant == "infonce_cosine_centred":
                h = h - h.mean(dim=0, keepdim=True)
            # ||h_i|| of the row divided by its max |value|: no overflow
            row_scale = h.detach().abs().amax(dim=1, keepdim=True).clamp_min(_FP32.tiny)
            norms = (torch.linalg.vector_norm(h / row_scale, dim=1, keepdim=True) * row_scale).clamp_min(_NORM_CLAMP)
            unit = h / norms
            logits = _off_diagonal(-(1.0 - unit @ unit.transpose(0, 1)) / tau)
        else:
            # B x B Gram matrix of the centred batch (distances are translation invariant; centring avoids
            # cancellation in |a|^2 + |b|^2 - 2<a, b>), divided by its largest |value| s against overflow
            centred = h - h.mean(dim=0, keepdim=True)
            s = centred.detach().abs().amax().clamp_min(_FP32.tiny)
            u = centred / s
            gram = u @ u.transpose(0, 1)
            if variant == "covariance":
                # sum_{p,q} C_pq^2 = ||U U^T||_F^2 / (B-1)^2 ;  sum_p C_pp^2 = sum_p (sum_i u_ip^2)^2 / (B-1)^2
                if d < 2:  # no off-diagonal entry
                    return (h * 0.0).sum()
                total = gram.square().sum()
                diagonal = u.square().sum(dim=0).square().sum()
                scaled = (total - diagonal).clamp_min(0.0) / ((b - 1) ** 2 * d * (d - 1))
                return scaled * s * s * s * s
            # ||h_i - h_j||^2 / D = q_ij * s^2, q in [0, 4]
            sq_norms = gram.diagonal()
            q = _off_diagonal((sq_norms[:, None] + sq_norms[None, :] - 2.0 * gram).clamp_min(0.0) / d)
            if variant == "hinge":
                return torch.relu(margin - _safe_sqrt(q) * s).square().mean()
            logits = -(q * s) * (s / tau)
        # InfoNCE: log(mean(exp(logits)) + eps) as log-sum-exp. -inf logits (overflowed distances) give logsumexp a
        # NaN gradient: keep them finite; exp() of the clamp value is 0 in fp32 anyway.
        logits = logits.clamp_min(-0.5 * _FP32.max)
        log_mean = torch.logsumexp(logits, dim=0) - math.log(logits.numel())
        if eps == 0:
            return log_mean
        return torch.logaddexp(log_mean, log_mean.new_tensor(math.log(eps)))


class DispersiveLoss(nn.Module):
    """One dispersive loss form at ``placement``: one feature map, or "all", the mean of the three. forward(features:
    ``MedDisSegOutput.features``, keys ``early``, ``middle``, ``late``, each (B, C, H, W)) -> 0-dim loss. ``gather``:
    under ``torch.distributed``, the value is the concatenated batch's loss on every process, DDP's averaged gradient
    its gradient; False: each process its own share."""

    def __init__(self, variant: str = "infonce_l2", tau: float = 0.8, eps: float = 1e-8, margin: float = 1.0,
                 placement: str = "early", gather: bool = True):
        super().__init__()
        _check_options(variant, tau, eps, margin)
        if placement not in DISPERSIVE_PLACEMENTS + ("all",):
            raise ValueError(f"DispersiveLoss: unknown placement {placement!r}, "
                             f"expected one of {DISPERSIVE_PLACEMENTS + ('all',)}")
        self.variant = variant
        self.tau = float(tau)
        self.eps = float(eps)
        self.margin = float(margin)
        self.placement = placement
        self.gather = bool(gather)
        #: the feature keys this loss reads (the first: the layer the trainers' diagnostics describe)
        self.placements: Tuple[str, ...] = DISPERSIVE_PLACEMENTS if placement == "all" else (placement,)

    def batch(self, features: Tensor) -> Tensor:
        """features: this process's share (B_r, ...) -> the batch this loss disperses (gathered if ``gather``)."""
        return gather_batch(features) if self.gather else features

    def of(self, features: Tensor) -> Tensor:
        """The loss of one feature map, features: this process's share (B_r, ...) -> 0-dim fp32."""
        return _dispersive(self.batch(features), self.variant, self.tau, self.eps, self.margin)

    def forward(self, features: Mapping[str, Tensor]) -> Tensor:
        losses = []
        for name in self.placements:
            if name not in features:
                raise ValueError(f"DispersiveLoss(placement={self.placement!r}): no {name!r} entry in the features, "
                                 f"got keys {sorted(features.keys())}")
            share = features[name]
            losses.append(_dispersive(gather_batch(share) if self.gather else share, self.variant, self.tau,
                                      self.eps, self.margin))
        return torch.stack(losses).mean()

    def extra_repr(self) -> str:
        return (f"variant={self.variant!r}, tau={self.tau}, eps={self.eps}, margin={self.margin}, "
                f"placement={self.placement!r}, gather={self.gather}")


def _centred_gram_in_blocks(h: Tensor, dtype: torch.dtype, scale: float) -> Tensor:
    """h: (B, D) -> (B, B) Gram matrix of the centred batch / ``scale`` in ``dtype``, summed over column blocks of
    ``DIAGNOSTICS_BLOCK_ELEMENTS // B`` dimensions: one (B, block) copy of the features at a time."""
    b, d = h.shape
    step = max(1, DIAGNOSTICS_BLOCK_ELEMENTS // b)
    gram = torch.zeros(b, b, dtype=dtype, device=h.device)
    for start in range(0, d, step):
        u = h[:, start:start + step].to(dtype)
        u = (u - u.mean(dim=0, keepdim=True)) / scale
        gram += u @ u.transpose(0, 1)
    return gram


@torch.no_grad()
def dispersion_diagnostics(features: Tensor) -> Dict[str, float]:
    """How spread out a batch of features (B, ...), flattened to (B, D), is; keys ``DIAGNOSTIC_KEYS``:
    - ``mean_pairwise_distance``: mean over i != j of ``||h_i - h_j||^2 / D`` (``infonce_l2``'s ``d_ij``); 0 if B < 2.
    - ``effective_rank``: exp of the Shannon entropy of the normalised singular values of the centred (B, D) batch
      (1 to B - 1); 0 when the centred batch is zero.
    Both from the centred batch's B x B Gram matrix in float64 (float32 on MPS), one block of extra memory at any D."""
    h = features.detach().reshape(features.shape[0], -1)
    b, d = h.shape
    if b < 2:
        return {"mean_pairwise_distance": 0.0, "effective_rank": 0.0}
    # float64 keeps a near low-rank batch's small singular values above rounding noise; the scale keeps fp32 sums finite
    dtype = torch.float32 if h.device.type == "mps" else torch.float64
    scale = float(h.abs().amax().float()) or 1.0
    if not math.isfinite(scale):
        return {"mean_pairwise_distance": math.nan, "effective_rank": math.nan}
    with torch.autocast(device_type=h.device.type, enabled=False):
        gram = _centred_gram_in_blocks(h, dtype, scale).double().cpu()
    sq_norms = gram.diagonal()
    q = (sq_norms[:, None] + sq_norms[None, :] - 2.0 * gram).clamp_min(0.0) / d
    mean_distance = float(_off_diagonal(q).mean()) * scale ** 2
    eigenvalues = torch.linalg.eigvalsh(gram)
    # eigenvalues at rounding level are zero singular values
    tolerance = eigenvalues.abs().max() * b * torch.finfo(dtype).eps
    singular = torch.where(eigenvalues > tolerance, eigenvalues, torch.zeros_like(eigenvalues)).sqrt()
    total = singular.sum()
    if total <= 0:
        return {"mean_pairwise_distance": mean_distance, "effective_rank": 0.0}
    p = singular[singular > 0] / total
    entropy = -(p * p.log()).sum()
    return {"mean_pairwise_distance": mean_distance, "effective_rank": float(entropy.exp())}
