"""WildCat's operator as it was before its step was made cheaper (issue 31, item 3), kept as the oracle of
`tests/test_wildcat_operator.py`: the same lines, with the key-side sums over all N keys (the per-group sums it
had were tested equal to these at rounding, `tests/test_pivot_loops.py`)."""

from __future__ import annotations

import torch

from models.attention.numerics import fp32_core, stable_pinv
from models.attention.wildcat import WildcatAttention, clamp_to_values
from models.landmarks.base import broadcast_mask, gather_tokens
from models.landmarks.rpcholesky import key_features
from models.landmarks.segment_means import segment_assignment


def previous_operator(
    self: WildcatAttention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, clamp: bool
) -> torch.Tensor:
    """The previous `WildcatAttention._operator`, verbatim but for the key sums (full width) and the coreset (the
    RPCholesky selector's eager loop, as it was the only one)."""
    n = q.shape[-2]
    r = self.rank_budget(n)
    scale = q.shape[-1] ** -0.25
    real = broadcast_mask(mask, q)  # [B, 1, N]
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    with fp32_core(q.device):
        qf, kf, vf = q.to(dtype) * scale, k.to(dtype) * scale, v.to(dtype)
        z, kc = key_features(qf, kf, real, self.tau, self.center_keys)
        bins = segment_assignment(real, self.num_bins) if self.num_bins > 1 else None
        bin_ids = None if bins is None else bins.expand(z.shape[:3])
        idx, valid = self.selector.pivots(z, real, r, bin_ids, self.num_bins)
        z_s, kc_s = gather_tokens(z, idx), gather_tokens(kc, idx)
        hsq = 0.5 * z.pow(2).sum(-1)  # ‖z‖²/2, [B, H, N]
        hsq_s = hsq.gather(-1, idx)  # [B, H, r]
        key_ok = real.expand(hsq.shape)
        pair = valid[..., :, None] & valid[..., None, :]  # [B, H, r, r]
        link = valid[..., :, None] & key_ok[..., None, :]  # [B, H, r, N]
        if bins is not None:
            bin_k = bins.expand(hsq.shape)
            bin_s = bin_k.gather(-1, idx)
            pair = pair & (bin_s[..., :, None] == bin_s[..., None, :])
            link = link & (bin_s[..., :, None] == bin_k[..., None, :])
        core = torch.exp(z_s @ z_s.transpose(-1, -2) - hsq_s[..., :, None] - hsq_s[..., None, :])
        eye = torch.eye(r, device=core.device, dtype=core.dtype)
        core_inv = stable_pinv(torch.where(pair, core, eye))
        rhs = torch.cat([vf, key_ok[..., None].to(vf.dtype)], dim=-1)  # [V | 1]
        logits_sk = (z_s @ z.transpose(-1, -2) - hsq_s[..., None]).masked_fill(~link, float("-inf"))
        shift = logits_sk.amax(dim=(-1, -2), keepdim=True).detach().nan_to_num(0.0, neginf=0.0)
        x_rhs = torch.exp(logits_sk - shift) @ rhs
        coef = core_inv @ x_rhs
        logits_q = (qf @ kc_s.transpose(-1, -2) - hsq_s[..., None, :]).masked_fill(~valid[..., None, :], float("-inf"))
        row_shift = logits_q.amax(-1, keepdim=True).detach().nan_to_num(0.0, neginf=0.0)
        left = torch.exp(logits_q - row_shift)  # [B, H, N, r]
        both = left @ coef
        partial = left @ torch.exp(hsq_s - shift.squeeze(-1)).unsqueeze(-1)
        den = torch.maximum(both[..., -1:], partial).clamp_min(torch.finfo(dtype).tiny)
        out = both[..., :-1] / den
        if clamp:
            out = clamp_to_values(out, vf, real)  # the same lines, moved
    return out.to(v.dtype)
