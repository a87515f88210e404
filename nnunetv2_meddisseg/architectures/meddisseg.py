"""Med-DisSeg for nnU-Net v2 (2D): ResNet-50 + ELAT encoder, enhancement, decoupling, CDFA, three CBAT decoders.

nnU-Net builds it as ``MedDisSegNet(input_channels, num_classes, deep_supervision, **arch_kwargs)``.
"""
import functools
import os
import pydoc
import warnings
from typing import Dict, Iterator, List, NamedTuple, Optional, Tuple, Type, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nnunetv2_meddisseg.blocks.activation import get_activation
from nnunetv2_meddisseg.blocks.attention import ELAT
from nnunetv2_meddisseg.blocks.cdfa import ContrastDrivenAggregation, ContrastGuidancePyramid
from nnunetv2_meddisseg.blocks.conv import PointwiseLinear
from nnunetv2_meddisseg.blocks.decoder import DECODER_FUSIONS, MultiScaleCBATDecoder
from nnunetv2_meddisseg.blocks.decoupling import AuxiliaryHeads, FeatureDecoupling
from nnunetv2_meddisseg.blocks.encoder import (
    ENCODER_CHANNELS,
    ResNet50Encoder,
    load_resnet50_weights,
    resolve_encoder_weights,
)
from nnunetv2_meddisseg.blocks.enhancement import FeatureEnhancement
from nnunetv2_meddisseg.blocks.norm import UncountedBatchNorm2d
from nnunetv2_meddisseg.environment import CPU_BF16_ENVIRONMENT_VARIABLE, flag_is_set

__all__ = ["OUTPUTS", "MedDisSegOutput", "MedDisSegNet", "cpu_bf16_requested", "cpu_supports_bf16"]

#: H and W are padded internally to a multiple of this (the encoder's total stride)
SIZE_DIVISOR = 16
#: what ``MedDisSegNet.forward`` returns, by its ``output`` argument
OUTPUTS = ("logits", "encoder", "all")


def cpu_bf16_requested() -> bool:
    """Whether ``nnUNet_meddisseg_cpu_bf16`` is set: ``cpu_bf16``'s default, read where a network is built."""
    return flag_is_set(CPU_BF16_ENVIRONMENT_VARIABLE)


def _cpu_bf16_flags() -> bool:
    """Native bf16 on this CPU: AVX512-BF16 or AMX (torch's checks, else /proc/cpuinfo's flags)."""
    checks = [getattr(torch.cpu, n, None) for n in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    checks = [c for c in checks if c is not None]
    if checks:
        return any(bool(c()) for c in checks)
    try:
        with open("/proc/cpuinfo") as f:
            flags = set(f.read().split())
    except OSError:
        return False
    return bool(flags & {"avx512_bf16", "amx_bf16"})


@functools.lru_cache(maxsize=None)
def cpu_supports_bf16() -> bool:
    """:func:`_cpu_bf16_flags`, checked once per process."""
    return _cpu_bf16_flags()


@functools.lru_cache(maxsize=None)
def _warn_no_cpu_bf16() -> None:
    """Warns once per process that bf16 was requested on a CPU without it."""
    warnings.warn(f"{CPU_BF16_ENVIRONMENT_VARIABLE} is set, but this CPU has no native bfloat16 support "
                  f"(AVX512-BF16 or AMX): "
                  f"MedDisSegNet predicts in fp32", RuntimeWarning, stacklevel=4)


class MedDisSegOutput(NamedTuple):
    """Every output of the network (``forward(x, output="all")``), read by Stage II's loss and the feature analysis."""

    logits: Tensor  #: (B, K, H, W) final logits (O_S + O_M + O_L with fusion "sum")
    #: O_S, O_M, O_L logits, each (B, K, H, W); None with decoder_fusion "concat"
    path_logits: Optional[Tuple[Tensor, Tensor, Tensor]]
    fg: Tensor  #: (B, 1, H, W) foreground-map logits
    bg: Tensor  #: (B, 1, H, W) background-map logits
    uc: Tensor  #: (B, 1, H, W) uncertainty-map logits
    #: 'early': ELAT-refined x2 (B, 256, H'/4, W'/4); 'middle': x4 (B, 1024, H'/16, W'/16);
    #: 'late': output of D_s (B, 128, H'/2, W'/2); H', W' = H, W padded to a multiple of 16
    features: Dict[str, Tensor]


def _resolve_op(op: Union[str, Type[nn.Module]], name: str) -> Type[nn.Module]:
    if isinstance(op, str):
        located = pydoc.locate(op)
        if located is None:
            raise ValueError(f"MedDisSegNet: cannot import {name}={op!r}")
        op = located
    if not (isinstance(op, type) and issubclass(op, nn.Module)):
        raise ValueError(f"MedDisSegNet: {name} must be an nn.Module class, got {op!r}")
    return op


class MedDisSegNet(nn.Module):
    """Med-DisSeg (2D only).

    Args:
        num_classes: output channels (nnU-Net's label count incl. background).
        deep_supervision: unused: each call names its output, so ``decoder.deep_supervision`` changes nothing either.
        encoder_weights: ResNet-50 state-dict file, "imagenet" (torch.hub's cache, never downloaded here) or None.
        elat: ELAT on each encoder output, on a side path so pretrained weights see their usual inputs (else identity).
        cbat: CBAT at the end of each decoding path (else a CBT3x3, the "w/o CBAT" ablation).
        activation: "telu" (paper) or "relu" (ablation) in the blocks Med-DisSeg adds; the encoder keeps its ReLU.
        decoder_fusion: "sum" (paper Eq. 9) or "concat" (released code).
        conv_op, norm_op, norm_op_kwargs: 2D operators (classes or dotted names).
        added_norm_op, added_norm_op_kwargs: norm of the blocks added to the encoder (ELAT has none); None: ``norm_op``
            (the paper's BatchNorm everywhere). ``torch.nn.InstanceNorm2d`` normalises per image, as nnU-Net does.

    forward(x, output="logits"): x (B, C, H, W), any H, W (padded to H', W', multiples of 16; outputs cropped back);
    by ``output`` (one of ``OUTPUTS``) it returns
        - ``"logits"``: (B, num_classes, H, W), without running the auxiliary heads;
        - ``"encoder"``: ELAT-refined [x1 (B,64,H'/2,W'/2), x2 (B,256,H'/4), x3 (B,512,H'/8), x4 (B,1024,H'/16)];
        - ``"all"``: ``MedDisSegOutput`` (Stage II's loss).

    With ``cpu_bf16`` (default: ``cpu_bf16_requested()``), eval-mode ``output="logits"`` CPU forwards (as in
    ``nnUNetv2_predict -device cpu``) run under bf16 autocast and return fp32 logits if the CPU has native bf16
    (else one warning, fp32).

    On CUDA every forward runs channels-last (weights moved once, in place; input per call), so cuDNN, the norms and
    bilinear up-sampling read and write NHWC without layout conversions; values are unchanged.
    """

    def __init__(
        self,
        input_channels: int,
        num_classes: int,
        deep_supervision: bool = False,
        encoder_weights: Optional[str] = None,
        elat: bool = True,
        activation: str = "telu",
        decoder_fusion: str = "sum",
        cbat: bool = True,
        conv_op: Union[str, Type[nn.Module]] = nn.Conv2d,
        norm_op: Union[str, Type[nn.Module]] = UncountedBatchNorm2d,
        norm_op_kwargs: Optional[dict] = None,
        added_norm_op: Union[str, Type[nn.Module], None] = None,
        added_norm_op_kwargs: Optional[dict] = None,
        cpu_bf16: Optional[bool] = None,
    ) -> None:
        super().__init__()
        conv_op = _resolve_op(conv_op, "conv_op")
        norm_op = _resolve_op(norm_op, "norm_op")
        if added_norm_op is None:
            added_norm_op, added_norm_op_kwargs = norm_op, norm_op_kwargs
        else:
            added_norm_op = _resolve_op(added_norm_op, "added_norm_op")
        if not issubclass(conv_op, nn.Conv2d):
            raise ValueError(
                f"MedDisSegNet is 2D only: conv_op must be a 2D convolution (torch.nn.Conv2d), got "
                f"{conv_op.__module__}.{conv_op.__name__}; use nnU-Net's 2d configuration"
            )
        for name, op in (("norm_op", norm_op), ("added_norm_op", added_norm_op)):
            if op.__name__.endswith(("1d", "3d", "1D", "3D")):
                raise ValueError(
                    f"MedDisSegNet is 2D only: {name} must be a 2D normalisation (e.g. torch.nn.BatchNorm2d), "
                    f"got {op.__module__}.{op.__name__}"
                )
        nonlin = get_activation(activation)
        if decoder_fusion not in DECODER_FUSIONS:
            raise ValueError(f"unknown decoder_fusion {decoder_fusion!r}: choose one of {list(DECODER_FUSIONS)}")
        if encoder_weights is not None:
            encoder_weights = resolve_encoder_weights(encoder_weights)
            if not os.path.isfile(encoder_weights):
                raise FileNotFoundError(f"encoder weights file not found: {encoder_weights}")
        self.input_channels = input_channels
        self.num_classes = num_classes
        #: CPU inference forwards under bf16 autocast (class docstring)
        self.cpu_bf16 = cpu_bf16_requested() if cpu_bf16 is None else bool(cpu_bf16)
        self._channels_last = False  # weights moved to channels-last (CUDA forwards, the CPU bf16 forward)
        #: (class, kwargs) of the normalisation in the blocks added to the encoder (also the Stage I head's)
        self.added_norm = (added_norm_op, dict(added_norm_op_kwargs or {}))
        blk = dict(nonlin=nonlin, conv_op=conv_op, norm_op=added_norm_op, norm_op_kwargs=added_norm_op_kwargs)
        dim = 128

        self.encoder = ResNet50Encoder(input_channels, conv_op, norm_op, norm_op_kwargs)
        self.elat = nn.ModuleList(
            [ELAT(c, nonlin=nonlin, conv_op=conv_op) if elat else nn.Identity() for c in ENCODER_CHANNELS]
        )
        self.enhancement = nn.ModuleList([FeatureEnhancement(c, dim, **blk) for c in ENCODER_CHANNELS])
        self.decoupling = FeatureDecoupling(ENCODER_CHANNELS[-1], 512, dim, **blk)
        self.auxiliary_heads = AuxiliaryHeads(dim, **blk)
        self.guidance = ContrastGuidancePyramid(dim, dim, (3, 2, 1, 0), **blk)
        # levels 1..4; levels 1..3 see [d_l; Up(CDFA_{l+1})]
        self.cdfa = nn.ModuleList([ContrastDrivenAggregation(2 * dim, dim, 4, **blk) for _ in range(3)]
                                  + [ContrastDrivenAggregation(dim, dim, 4, **blk)])
        self.decoder = MultiScaleCBATDecoder(dim, num_classes, decoder_fusion, cbat=cbat, **blk)

        self._init_non_encoder_weights()
        if encoder_weights is not None:
            load_resnet50_weights(self.encoder, encoder_weights)

    def _init_non_encoder_weights(self) -> None:
        # He initialisation as in nnU-Net (the encoder keeps torchvision's, PointwiseLinear layers Linear's)
        encoder_modules = set(self.encoder.modules())
        for m in self.modules():
            if m not in encoder_modules and isinstance(m, nn.Conv2d) and not isinstance(m, PointwiseLinear):
                nn.init.kaiming_normal_(m.weight, a=1e-2)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def encoder_parameters(self) -> Iterator[nn.Parameter]:
        """Encoder + ELAT parameters (the low-learning-rate group)."""
        yield from self.encoder.parameters()
        yield from self.elat.parameters()

    def non_encoder_parameters(self) -> Iterator[nn.Parameter]:
        """All parameters not yielded by ``encoder_parameters``."""
        encoder_ids = {id(p) for p in self.encoder_parameters()}
        yield from (p for p in self.parameters() if id(p) not in encoder_ids)

    def encode(self, x: Tensor) -> List[Tensor]:
        """x: (B, C, H', W'), H', W' multiples of 16 -> the four ELAT-refined encoder features."""
        return [att(f) for att, f in zip(self.elat, self.encoder(x))]

    def _cpu_bf16_inference(self, x: Tensor, output: str) -> bool:
        """Whether this forward runs under CPU bf16 autocast (see the class docstring)."""
        if self.training or output != "logits" or x.device.type != "cpu" or not self.cpu_bf16:
            return False
        if not cpu_supports_bf16():
            _warn_no_cpu_bf16()
            return False
        return True

    def forward(self, x: Tensor, output: str = "logits") -> Union[Tensor, List[Tensor], MedDisSegOutput]:
        if output not in OUTPUTS:
            raise ValueError(f"MedDisSegNet: unknown output {output!r}: choose one of {list(OUTPUTS)}")
        if self._cpu_bf16_inference(x, output):
            return self._forward_cpu_bf16(x)
        if x.is_cuda:
            if not torch.compiler.is_compiling():  # a whole-network compile traces the input's conversion only
                self._use_channels_last()
            x = x.contiguous(memory_format=torch.channels_last)
        return self._forward(x, output)

    def _use_channels_last(self) -> None:
        """Move the weights to channels-last memory format, once (in place: parameters keep their identity)."""
        if not self._channels_last:
            self.to(memory_format=torch.channels_last)
            self._channels_last = True

    def _forward_cpu_bf16(self, x: Tensor) -> Tensor:
        """CPU bf16 inference forward: x (B, C, H, W) -> fp32 logits (B, num_classes, H, W).

        Weights go channels-last once (in place): oneDNN's bf16 convolutions would otherwise reorder channels-first
        activations around every call, costing about what the arithmetic saves. The encoder and ELAT (6 % of the
        FLOPs at 256x256) stay fp32: in bf16 they cause most of the pixels whose arg-max differs from fp32.
        """
        self._use_channels_last()
        x = x.contiguous(memory_format=torch.channels_last)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = self._forward(x, "logits", fp32_encoder=True)
        return logits.float().contiguous()

    def _forward(self, x: Tensor, output: str, fp32_encoder: bool = False) -> Union[Tensor, List[Tensor],
                                                                                   MedDisSegOutput]:
        if x.ndim != 4:
            raise ValueError(f"MedDisSegNet is 2D only: expected input of shape (B, C, H, W), got {tuple(x.shape)}")
        if x.shape[1] != self.input_channels:
            raise ValueError(f"MedDisSegNet: expected {self.input_channels} input channels, got {x.shape[1]}")
        h, w = x.shape[2:]
        pad_h, pad_w = (-h) % SIZE_DIVISOR, (-w) % SIZE_DIVISOR
        if pad_h or pad_w:
            x = F.pad(x, (0, pad_w, 0, pad_h))
        padded_size = x.shape[2:]

        if fp32_encoder:
            with torch.autocast(x.device.type, enabled=False):
                feats = self.encode(x.float())
        else:
            feats = self.encode(x)
        if output == "encoder":
            return feats

        with_aux = output == "all"
        d = [enh(f) for enh, f in zip(self.enhancement, feats)]
        f_fg, f_bg, f_uc = self.decoupling(feats[3], with_uncertainty=with_aux)
        guides = self.guidance(f_fg, f_bg)
        agg: List[Optional[Tensor]] = [None] * 4
        agg[3] = self.cdfa[3](d[3], *guides[3])
        for level in (2, 1, 0):
            up = F.interpolate(agg[level + 1], size=d[level].shape[2:], mode="bilinear", align_corners=False)
            agg[level] = self.cdfa[level](torch.cat([d[level], up], dim=1), *guides[level])
        logits, path_logits, late = self.decoder(agg, padded_size)

        def crop(t: Tensor) -> Tensor:
            return t[:, :, :h, :w] if (pad_h or pad_w) else t

        logits = crop(logits)
        if not with_aux:
            return logits
        if path_logits is not None:
            path_logits = tuple(crop(p) for p in path_logits)
        fg, bg, uc = (crop(t) for t in self.auxiliary_heads(f_fg, f_bg, f_uc))
        return MedDisSegOutput(logits, path_logits, fg, bg, uc, {"early": feats[1], "middle": feats[3], "late": late})

