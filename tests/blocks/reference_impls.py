"""First implementations of optimised blocks: the references the tests check the current ones against.

Same parameters, same results up to floating-point rounding. ``use_reference_implementations`` and
``use_previous_implementations`` swap them into a whole network (the op-count and architecture tests).
"""
import types
from typing import Dict, List, Mapping, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nnunetv2_meddisseg.blocks.activation import TELU_EXP_CLAMP, TeLU
from nnunetv2_meddisseg.blocks.attention import ChannelAttention, SpatialAttention
from nnunetv2_meddisseg.blocks.cdfa import ContrastDrivenAggregation, ContrastGuidancePyramid
from nnunetv2_meddisseg.blocks.conv import ConvNormAct
from nnunetv2_meddisseg.blocks.decoupling import AuxiliaryHeads, FeatureDecoupling
from nnunetv2_meddisseg.blocks.enhancement import FeatureEnhancement

__all__ = ["reference_window_weights", "reference_window_attention", "reference_linear", "reference_cdfa_forward",
           "reference_telu", "previous_telu", "previous_channel_attention", "previous_enhancement_forward",
           "PreviousContrastGuidancePyramid", "PreviousFeatureDecoupling", "PreviousAuxiliaryHead",
           "PreviousAuxiliaryHeads", "PreviousFeatureEnhancement", "branch_layout", "merge_branches",
           "split_branches", "previous_of", "use_reference_implementations",
           "use_previous_implementations"]


def reference_window_weights(module: ContrastDrivenAggregation, guidance: Tensor, layer: nn.Linear) -> Tensor:
    """First implementation of ``ContrastDrivenAggregation.window_weights``.

    guidance: (B, dim, H, W) -> (B, heads, H*W, k*k (i), k*k (j))
    """
    b, _, h, w = guidance.shape
    window = module.kernel_size * module.kernel_size
    logits = layer(guidance.flatten(2).transpose(1, 2))  # (B, HW, heads * window * window)
    logits = logits.reshape(b, h * w, module.num_heads, window, window).transpose(1, 2)
    return torch.softmax(logits * module.scale, dim=-1)


def reference_window_attention(module: ContrastDrivenAggregation, values: Tensor, weights: Tensor) -> Tensor:
    """First implementation of ``window_attention`` (unfold -> per-pixel matmul -> fold).

    values: (B, dim, H, W), weights: (B, heads, H*W, k*k, k*k) -> (B, dim, H, W)
    """
    b, c, h, w = values.shape
    k, window = module.kernel_size, module.kernel_size * module.kernel_size
    # unfold channel index is c * window + j, c = head * head_dim + d
    v = F.unfold(values, k, padding=k // 2).reshape(b, module.num_heads, module.head_dim, window, h * w)
    v = v.permute(0, 1, 4, 3, 2)  # (B, heads, HW, j, head_dim)
    out = torch.matmul(weights, v)  # (B, heads, HW, i, head_dim)
    out = out.permute(0, 1, 4, 3, 2).reshape(b, c * window, h * w)
    out = F.fold(out, (h, w), k, padding=k // 2)  # sums the overlapping window contributions
    return reference_linear(module.proj, out)


def reference_linear(layer: nn.Module, x: Tensor) -> Tensor:
    """A Linear layer (or a 1x1 convolution's weight as one) on channel-last views: (B, C, H, W) -> (B, C_out, H, W)"""
    return F.linear(x.permute(0, 2, 3, 1), layer.weight.flatten(1), layer.bias).permute(0, 3, 1, 2)


def reference_cdfa_forward(module: ContrastDrivenAggregation, x: Tensor, fg: Tensor, bg: Tensor) -> Tensor:
    """``ContrastDrivenAggregation.forward`` as first implemented (same parameters, same result up to
    floating-point rounding)."""
    x = module.input_convs(x)
    v = reference_linear(module.value, x)
    x = reference_window_attention(module, v, reference_window_weights(module, fg, module.attn_fg))
    x = reference_window_attention(module, x, reference_window_weights(module, bg, module.attn_bg))
    return module.output_convs(x)


def reference_telu(x: Tensor) -> Tensor:
    """First implementation of ``telu`` (plain autograd)."""
    return x * torch.tanh(torch.exp(x.clamp(max=TELU_EXP_CLAMP)))


# ---------------------------------------------------------------------------------------------------------------
# The implementations before the launch-count reduction (same parameters, same results up to rounding): the
# references of the current blocks, and the "previous" network of the before/after benchmarks. The CDFA window
# attention of that time is the block's shifted form, which the block runs on the CPU (a block whose ``form``
# is ``"shifted"`` runs it on any device: ``blocks.device_forms``).

class _PreviousTeLUFunction(torch.autograd.Function):
    """TeLU with the hand-written backward as it was (12 operations)."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        ctx.save_for_backward(x)
        y = torch.exp(x)
        y.tanh_()
        return y.mul_(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        e = torch.exp(x.clamp(max=TELU_EXP_CLAMP))
        t = torch.tanh(e)
        inner = t.square().neg_().add_(1).mul_(x).mul_(e)
        inner.masked_fill_(x > TELU_EXP_CLAMP, 0.0)
        return grad * inner.add_(t)


def previous_telu(x: Tensor) -> Tensor:
    """``telu`` before the launch-count reduction (on CPU tensors that are not bf16)."""
    if torch.is_grad_enabled() and x.requires_grad:
        return _PreviousTeLUFunction.apply(x)
    y = torch.exp(x)
    y.tanh_()
    return y.mul_(x)


def reference_mlp(mlp: nn.Sequential, v: Tensor) -> Tensor:
    """A channel-attention MLP (Linear -> activation -> Linear, the Linear layers possibly stored as 1x1
    convolutions) as Linear layers on pooled rows: (N, C) -> (N, C)"""
    first, nonlin, second = mlp
    v = F.linear(v, first.weight.flatten(1), first.bias)
    return F.linear(nonlin(v), second.weight.flatten(1), second.bias)


def previous_channel_attention(module: nn.Module, x: Tensor) -> Tensor:
    """``ChannelAttention.attention`` before: one MLP pass per pooling, Linear layers on pooled rows. -> (B, C, 1, 1)"""
    avg = reference_mlp(module.mlp, x.mean(dim=(2, 3)))
    mx = reference_mlp(module.mlp, x.amax(dim=(2, 3)))
    return torch.sigmoid(avg + mx)[:, :, None, None]


def previous_enhancement_forward(module: nn.Module, x: Tensor) -> Tensor:
    """``FeatureEnhancement.forward`` before: each branch (CBT, channel attention) on its own (on a
    :class:`PreviousFeatureEnhancement`)."""
    outs = []
    for branch in module.branches:
        y = branch[0](x)
        outs.append(y * previous_channel_attention(branch[1], y))
    fused = module.fuse(torch.cat(outs, dim=1))
    return module.spatial_attention(module.nonlin(fused + module.shortcut(x)))


# ---------------------------------------------------------------------------------------------------------------
# Blocks whose parallel branches now run as one grouped block (same parameters, merged along the first axis of
# every tensor): the separate branches as they were, and the conversion between their states.

#: how a merged block holds separate ones: (name of a merged sub-module, names of the separate sub-modules whose
#: tensors it holds, concatenated along the first axis in this order)
Layout = List[Tuple[str, List[str]]]


def branch_layout(merged: nn.Module) -> Layout:
    """The separate sub-modules each sub-module of ``merged`` holds (a guidance pyramid, feature decoupling,
    auxiliary heads or feature enhancement)."""
    if isinstance(merged, ContrastGuidancePyramid):
        levels = range(len(merged.num_upsamplings))
        layout = [("stem", [f"{side}.{lv}.stem" for side in ("fg", "bg") for lv in levels])]
        for s, lvs in enumerate(merged.step_levels):
            layout.append((f"up_convs.{s}", [f"{side}.{lv}.up_convs.{s}" for side in ("fg", "bg") for lv in lvs]))
        return layout
    if isinstance(merged, FeatureDecoupling):
        return [(f"fg_bg.{i}", [f"branches.fg.{i}", f"branches.bg.{i}"]) for i in range(3)] + \
            [(f"uc.{i}", [f"branches.uc.{i}"]) for i in range(3)]
    if isinstance(merged, AuxiliaryHeads):
        names = ["stem"] + [f"up_convs.{i}" for i in range(len(merged.up_convs))] + ["out"]
        return [(name, [f"{head}.{name}" for head in merged.HEADS]) for name in names]
    if isinstance(merged, FeatureEnhancement):
        n = merged.num_branches
        return [("pointwise", ["shortcut.conv", "branches.0.0.conv"])] + \
            [(f"dilated.{i}", [f"branches.{i + 1}.0.conv"]) for i in range(n - 1)] + \
            [("norm", ["shortcut.norm"] + [f"branches.{i}.0.norm" for i in range(n)]),
             ("attention_hidden", [f"branches.{i}.1.mlp.0" for i in range(n)]),
             ("attention_out", [f"branches.{i}.1.mlp.2" for i in range(n)])]
    raise TypeError(f"{type(merged).__name__} has no separate-branch form")


def _suffixes(state_dict: Mapping[str, Tensor], key_prefix: str) -> List[str]:
    return [k[len(key_prefix):] for k in state_dict if k.startswith(key_prefix)]


def merge_branches(state_dict: Mapping[str, Tensor], layout: Layout) -> Dict[str, Tensor]:
    """The merged block's state from the separate branches' (``old + '.' + tensor name``): every tensor of a
    merged sub-module is the concatenation along the first axis of the branches' tensors, in ``layout``'s order
    (``num_batches_tracked``, a scalar, is taken from the first branch); other keys are kept as they are."""
    olds = tuple(f"{old}." for _, names in layout for old in names)
    out = {k: v for k, v in state_dict.items() if not k.startswith(olds)}
    for new, names in layout:
        for name in _suffixes(state_dict, f"{names[0]}."):
            parts = [state_dict[f"{old}.{name}"] for old in names]
            out[f"{new}.{name}"] = parts[0].clone() if name.endswith("num_batches_tracked") else torch.cat(parts)
    return out


def split_branches(state_dict: Mapping[str, Tensor], layout: Layout) -> Dict[str, Tensor]:
    """The inverse of :func:`merge_branches`: the separate branches' state from a merged one (the keys of
    sub-modules that ``layout`` does not name are kept as they are)."""
    merged = tuple(f"{new}." for new, _ in layout)
    out: Dict[str, Tensor] = {k: v for k, v in state_dict.items() if not k.startswith(merged)}
    for new, olds in layout:
        for name in _suffixes(state_dict, f"{new}."):
            value = state_dict[f"{new}.{name}"]
            parts = [value] * len(olds) if name.endswith("num_batches_tracked") else value.chunk(len(olds), dim=0)
            for old, part in zip(olds, parts):
                out[f"{old}.{name}"] = part.clone()
    return out


class PreviousGuidanceBranch(nn.Module):
    """One guidance branch as it was: CBT3x3, then ``num_upsamplings`` x [bilinear x2, CBT3x3]."""

    def __init__(self, in_channels, out_channels, num_upsamplings, **ops) -> None:
        super().__init__()
        self.stem = ConvNormAct(in_channels, out_channels, 3, **ops)
        self.up_convs = nn.ModuleList([ConvNormAct(out_channels, out_channels, 3, **ops)
                                       for _ in range(num_upsamplings)])

    def forward(self, x: Tensor) -> Tensor:
        x = self.stem(x)
        for conv in self.up_convs:
            x = conv(F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False))
        return x


class PreviousContrastGuidancePyramid(nn.Module):
    """``ContrastGuidancePyramid`` as it was: a separate fg and bg branch per level."""

    def __init__(self, in_channels=128, out_channels=128, num_upsamplings=(3, 2, 1, 0), **ops) -> None:
        super().__init__()
        self.fg = nn.ModuleList([PreviousGuidanceBranch(in_channels, out_channels, n, **ops) for n in num_upsamplings])
        self.bg = nn.ModuleList([PreviousGuidanceBranch(in_channels, out_channels, n, **ops) for n in num_upsamplings])

    def forward(self, f_fg: Tensor, f_bg: Tensor):
        return [(fg(f_fg), bg(f_bg)) for fg, bg in zip(self.fg, self.bg)]


def previous_of(merged: nn.Module, previous: nn.Module) -> nn.Module:
    """``previous`` (a block of the separate-branch layout) given the weights and statistics of ``merged``
    (:func:`branch_layout` says which branch each slice belongs to), in ``merged``'s mode, device and dtype."""
    previous.load_state_dict(split_branches(merged.state_dict(), branch_layout(merged)), strict=True)
    p = next(merged.parameters())
    return previous.to(device=p.device, dtype=p.dtype).train(merged.training)


class PreviousFeatureDecoupling(nn.Module):
    """``FeatureDecoupling`` as it was: three independent branches CBT3x3, CBT3x3, CBT1x1."""

    BRANCHES = ("fg", "bg", "uc")

    def __init__(self, in_channels=1024, mid_channels=512, out_channels=128, **ops) -> None:
        super().__init__()
        self.branches = nn.ModuleDict({
            name: nn.Sequential(ConvNormAct(in_channels, mid_channels, 3, **ops),
                                ConvNormAct(mid_channels, out_channels, 3, **ops),
                                ConvNormAct(out_channels, out_channels, 1, **ops))
            for name in self.BRANCHES})

    def forward(self, x: Tensor, with_uncertainty: bool = True):
        f_uc = self.branches["uc"](x) if with_uncertainty else None
        return self.branches["fg"](x), self.branches["bg"](x), f_uc


class PreviousAuxiliaryHead(nn.Module):
    """One auxiliary head as it was: CBT3x3, [bilinear x2, CBT3x3] per further entry of channels, Conv1x1 -> 1."""

    def __init__(self, in_channels=128, channels=(256, 256, 128, 64, 64), conv_op=nn.Conv2d, **ops) -> None:
        super().__init__()
        self.stem = ConvNormAct(in_channels, channels[0], 3, conv_op=conv_op, **ops)
        self.up_convs = nn.ModuleList([ConvNormAct(c_in, c_out, 3, conv_op=conv_op, **ops)
                                       for c_in, c_out in zip(channels[:-1], channels[1:])])
        self.out = conv_op(channels[-1], 1, 1, bias=True)

    def forward(self, x: Tensor) -> Tensor:
        x = self.stem(x)
        for conv in self.up_convs:
            x = conv(F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False))
        return self.out(x)


class PreviousAuxiliaryHeads(nn.Module):
    """The three heads as they were (``auxiliary_heads.fg`` / ``.bg`` / ``.uc``), called as ``AuxiliaryHeads``."""

    def __init__(self, in_channels=128, channels=(256, 256, 128, 64, 64), **ops) -> None:
        super().__init__()
        self.heads = nn.ModuleDict({name: PreviousAuxiliaryHead(in_channels, channels, **ops)
                                    for name in ("fg", "bg", "uc")})

    def state_dict(self, *args, **kwargs):  # the keys of the ModuleDict it was: fg.stem..., not heads.fg.stem...
        return self.heads.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict, strict=True, assign=False):
        return self.heads.load_state_dict(state_dict, strict=strict, assign=assign)

    def forward(self, f_fg: Tensor, f_bg: Tensor, f_uc: Tensor):
        return self.heads["fg"](f_fg), self.heads["bg"](f_bg), self.heads["uc"](f_uc)


class PreviousFeatureEnhancement(nn.Module):
    """``FeatureEnhancement`` as it was: separate branches CBT (1x1, then 3x3 per dilation) -> channel attention,
    a separate Conv1x1-Norm shortcut; run branch by branch (:func:`previous_enhancement_forward`)."""

    def __init__(self, in_channels, out_channels=128, dilations=(6, 12, 18), reduction=16, conv_op=nn.Conv2d,
                 norm_op=nn.BatchNorm2d, norm_op_kwargs=None, nonlin=TeLU) -> None:
        super().__init__()
        ops = dict(conv_op=conv_op, norm_op=norm_op, norm_op_kwargs=norm_op_kwargs)
        branches = [nn.Sequential(ConvNormAct(in_channels, out_channels, 1, nonlin=nonlin, **ops),
                                  ChannelAttention(out_channels, reduction, nonlin))]
        for d in dilations:
            branches.append(nn.Sequential(ConvNormAct(in_channels, out_channels, 3, nonlin=nonlin, dilation=d, **ops),
                                          ChannelAttention(out_channels, reduction, nonlin)))
        self.branches = nn.ModuleList(branches)
        self.fuse = ConvNormAct(out_channels * len(branches), out_channels, 3, nonlin=None, **ops)
        self.shortcut = ConvNormAct(in_channels, out_channels, 1, nonlin=None, **ops)
        self.nonlin = nonlin()
        self.spatial_attention = SpatialAttention(7, bias=False, conv_op=conv_op)

    def forward(self, x: Tensor) -> Tensor:
        return previous_enhancement_forward(self, x)


def use_reference_implementations(net: nn.Module) -> nn.Module:
    """Switch every optimised block of ``net`` (in place) back to its first implementation.

    Same parameters, same results up to floating-point rounding (the block tests prove it).
    """
    from nnunetv2_meddisseg.blocks.activation import TeLU
    from nnunetv2_meddisseg.blocks.cdfa import ContrastDrivenAggregation

    for m in net.modules():
        if isinstance(m, ContrastDrivenAggregation):
            m.forward = (lambda mod: lambda x, fg, bg: reference_cdfa_forward(mod, x, fg, bg))(m)
        elif isinstance(m, TeLU):
            m.forward = reference_telu
    return net


def use_previous_implementations(net: nn.Module) -> nn.Module:
    """Switch the blocks of ``net`` (in place) back to their implementations before the launch-count
    reduction: CDFA's shifted-view window attention on every device (the block's CPU form), each
    enhancement branch with its own channel attention, one MLP pass per pooling in every channel
    attention, TeLU's longer backward, the guidance pyramid's, the decoupling's and the auxiliary heads'
    branches each on its own. Same parameters (the separate branches get copies of the merged blocks'
    slices), same results up to rounding (the block tests)."""
    from nnunetv2_meddisseg.blocks.activation import TeLU
    from nnunetv2_meddisseg.blocks.attention import ChannelAttention
    from nnunetv2_meddisseg.blocks.cdfa import ContrastDrivenAggregation
    from nnunetv2_meddisseg.blocks.device_forms import implementation_form_of

    def aggregate_in_cpu_form(module, *args):
        with implementation_form_of(module, "cpu"):
            return type(module)._aggregate(module, *args)

    for m in net.modules():
        if isinstance(m, ContrastDrivenAggregation):
            m._aggregate = types.MethodType(aggregate_in_cpu_form, m)
        elif isinstance(m, ChannelAttention):
            m.attention = types.MethodType(previous_channel_attention, m)
        elif isinstance(m, TeLU):
            m.forward = previous_telu
    # the blocks whose branches now run as one: separate branches again (copies of the merged weights)
    guidance, decoupling, heads = net.guidance, net.decoupling, net.auxiliary_heads
    ops = dict(conv_op=type(guidance.stem.conv), norm_op=type(guidance.stem.norm), nonlin=type(guidance.stem.nonlin))
    net.guidance = previous_of(guidance, PreviousContrastGuidancePyramid(
        guidance.stem.conv.in_channels // 2, guidance.out_channels, guidance.num_upsamplings, **ops))
    first = decoupling.uc[0].conv
    net.decoupling = previous_of(decoupling, PreviousFeatureDecoupling(
        first.in_channels, first.out_channels, decoupling.out_channels, **ops))
    channels = [heads.stem.conv.out_channels // 3] + [c.conv.out_channels // 3 for c in heads.up_convs]
    net.auxiliary_heads = previous_of(heads, PreviousAuxiliaryHeads(heads.stem.conv.in_channels // 3, channels, **ops))
    for i, enh in enumerate(net.enhancement):
        net.enhancement[i] = previous_of(enh, PreviousFeatureEnhancement(
            enh.pointwise.in_channels, enh.out_channels, enh.dilations, conv_op=type(enh.pointwise),
            norm_op=type(enh.norm), nonlin=type(enh.nonlin)))
    for part in (net.guidance, net.decoupling, net.auxiliary_heads, net.enhancement):
        for m in part.modules():
            if isinstance(m, ChannelAttention):
                m.attention = types.MethodType(previous_channel_attention, m)
            elif isinstance(m, TeLU):
                m.forward = previous_telu
    return net
