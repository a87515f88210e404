"""ResNet-50 encoder (stem + layer1..layer3) in torchvision's state-dict layout, and its weight loader.

The encoder keeps ResNet's own ReLU (stem and bottlenecks) regardless of the network's
``activation`` option, so that ImageNet weights stay meaningful; TeLU is used in the blocks that
Med-DisSeg adds on top. ``layer4`` is not built (Med-DisSeg decodes from x1..x4).

Encoder weights are a local torchvision ResNet-50 state-dict file, or :data:`IMAGENET`: torchvision's
``ResNet50_Weights.IMAGENET1K_V1`` (the weights the paper's code loads) in torch.hub's cache
(``torch.hub.get_dir()/checkpoints``, which follows ``TORCH_HOME``). Only
:func:`download_imagenet_weights` (called by the plan command, once) ever downloads; everything else
reads the cached file and fails with a one-line message naming it when it is missing.
"""
import os
import re
from typing import Dict, List, Optional, Tuple, Type
from urllib.parse import urlparse

import torch
from torch import Tensor, nn

from nnunetv2_meddisseg.torch_files import UnsafeTorchFile, load_weights_only

__all__ = ["Bottleneck", "ResNet50Encoder", "load_resnet50_weights", "resnet50_state", "SECONDARY_COPIES",
           "SECONDARY_STARTS", "RESNET50_BLOCKS", "ENCODER_CHANNELS",
           "IMAGENET", "imagenet_weights_url", "imagenet_weights_file", "resolve_encoder_weights",
           "download_imagenet_weights"]

#: bottleneck blocks per stage of ResNet-50 (layer1, layer2, layer3; layer4 = 3 is unused)
RESNET50_BLOCKS = (3, 4, 6)
#: channels of the four returned features x1..x4
ENCODER_CHANNELS = (64, 256, 512, 1024)
#: the ``encoder_weights`` value naming torchvision's ResNet-50 ``IMAGENET1K_V1`` weights
IMAGENET = "imagenet"


class Bottleneck(nn.Module):
    """ResNet v1.5 bottleneck (stride on the 3x3 conv), torchvision key names.

    x: (B, in_channels, H, W) -> (B, 4 * width, H / stride, W / stride)
    """

    expansion = 4

    def __init__(
        self,
        in_channels: int,
        width: int,
        stride: int = 1,
        conv_op: Type[nn.Module] = nn.Conv2d,
        norm_op: Type[nn.Module] = nn.BatchNorm2d,
        norm_op_kwargs: Optional[dict] = None,
    ) -> None:
        super().__init__()
        nkw = norm_op_kwargs or {}
        out_channels = width * self.expansion
        self.conv1 = conv_op(in_channels, width, 1, bias=False)
        self.bn1 = norm_op(width, **nkw)
        self.conv2 = conv_op(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = norm_op(width, **nkw)
        self.conv3 = conv_op(width, out_channels, 1, bias=False)
        self.bn3 = norm_op(out_channels, **nkw)
        self.relu = nn.ReLU(inplace=True)
        self.downsample: Optional[nn.Module] = None
        if stride != 1 or in_channels != out_channels:
            self.downsample = nn.Sequential(
                conv_op(in_channels, out_channels, 1, stride=stride, bias=False), norm_op(out_channels, **nkw)
            )

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet50Encoder(nn.Module):
    """ResNet-50 stem + layer1..layer3 returning four feature maps.

    Keys match torchvision's ``resnet50().state_dict()`` (``conv1``, ``bn1``, ``layer1.0.conv1``, ...)
    without ``layer4`` and ``fc``.

    x: (B, input_channels, H, W) with H, W divisible by 16 ->
    [x1 (B, 64, H/2, W/2) after conv1/bn1/relu (before the max-pool),
     x2 (B, 256, H/4, W/4), x3 (B, 512, H/8, W/8), x4 (B, 1024, H/16, W/16)]
    """

    def __init__(
        self,
        input_channels: int = 3,
        conv_op: Type[nn.Module] = nn.Conv2d,
        norm_op: Type[nn.Module] = nn.BatchNorm2d,
        norm_op_kwargs: Optional[dict] = None,
    ) -> None:
        super().__init__()
        nkw = norm_op_kwargs or {}
        self.input_channels = input_channels
        self.conv1 = conv_op(input_channels, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = norm_op(64, **nkw)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        in_channels = 64
        for i, (n_blocks, width, stride) in enumerate(zip(RESNET50_BLOCKS, (64, 128, 256), (1, 2, 2))):
            blocks = []
            for b in range(n_blocks):
                blocks.append(
                    Bottleneck(in_channels, width, stride if b == 0 else 1, conv_op, norm_op, norm_op_kwargs)
                )
                in_channels = width * Bottleneck.expansion
            setattr(self, f"layer{i + 1}", nn.Sequential(*blocks))
        self.output_channels = ENCODER_CHANNELS
        self._init_weights()

    def _init_weights(self) -> None:
        # torchvision's ResNet initialisation
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)) and m.weight is not None:
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: Tensor) -> List[Tensor]:
        x1 = self.relu(self.bn1(self.conv1(x)))
        x2 = self.layer1(self.maxpool(x1))
        x3 = self.layer2(x2)
        x4 = self.layer3(x3)
        return [x1, x2, x3, x4]


def _is_ignored(key: str) -> bool:
    return key.startswith("fc.") or key.startswith("layer4.")


#: components of a key prefix that name the second copy of an encoder in a self-supervised checkpoint (MoCo's key
#: encoder, DINO's student next to its teacher, an EMA copy), besides those starting with :data:`SECONDARY_STARTS`
#: (``momentum_encoder``, ``target_network``, ...); where a file holds several encoders, such copies are passed over
SECONDARY_COPIES = frozenset({"encoder_k", "student", "state_dict_ema", "model_ema"})
SECONDARY_STARTS = ("momentum", "target", "ema")

#: where the stages of ``torchvision.models.resnet50`` sit in ``nn.Sequential(*resnet.children())`` (BYOL-style
#: ``encoder.0.weight``, ``encoder.4.0.conv1.weight``, ...)
_CHILDREN = {"0": "conv1", "1": "bn1", "4": "layer1", "5": "layer2", "6": "layer3", "7": "layer4"}

#: a ``conv1.weight`` inside a bottleneck (``layer1.0.conv1.weight``, ``4.0.conv1.weight``), not the stem
_BLOCK_PREFIX = re.compile(r"(^|\.)(layer)?\d+\.\d+\.$")


def _flatten(state: dict, prefix: str = "") -> Dict[str, object]:
    """``state`` with nested dicts of string keys joined into dotted keys (``{'state_dict': {'a': t}}`` ->
    ``{'state_dict.a': t}``); dicts with other keys (an optimizer's state) are left out."""
    flat: Dict[str, object] = {}
    for key, value in state.items():
        if not isinstance(key, str):
            continue
        if isinstance(value, dict):
            if value and all(isinstance(k, str) for k in value):
                flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _candidates(flat: Dict[str, object]) -> Dict[str, Dict[str, object]]:
    """``{prefix: its keys in torchvision's names}`` for every ResNet stem in ``flat``: a ``<prefix>conv1.weight``
    (torchvision and timm names) or a ``<prefix>0.weight`` next to ``<prefix>4.0.conv1.weight`` (the children of
    a torchvision ResNet in an ``nn.Sequential``)."""
    found: Dict[str, Dict[str, object]] = {}
    for key in flat:
        if key.endswith("conv1.weight"):
            prefix = key[:-len("conv1.weight")]
            if (prefix == "" or prefix.endswith(".")) and not _BLOCK_PREFIX.search(prefix):
                found[prefix] = {k[len(prefix):]: v for k, v in flat.items() if k.startswith(prefix)}
        elif key.endswith("0.weight") and key[:-len("0.weight")] + "4.0.conv1.weight" in flat:
            prefix = key[:-len("0.weight")]
            if prefix == "" or prefix.endswith("."):
                renamed = {}
                for k, v in flat.items():
                    if k.startswith(prefix):
                        head, _, tail = k[len(prefix):].partition(".")
                        renamed[f"{_CHILDREN[head]}.{tail}" if head in _CHILDREN else k[len(prefix):]] = v
                found[prefix] = renamed
    return found


def _is_secondary(prefix: str) -> bool:
    return any(part in SECONDARY_COPIES or part.startswith(SECONDARY_STARTS) for part in prefix.split("."))


def resnet50_state(state: object, path: str) -> Tuple[str, Dict[str, object]]:
    """The ResNet-50 encoder in a loaded weights file ``state``: ``(prefix, its keys in torchvision's names)``.

    Reads torchvision's and timm's ResNet-50 names, alone or under a prefix (``module.``, ``backbone.``,
    ``module.encoder_q.``, ``base_encoder.``, ``encoder.``, ...), in dicts nested under any string keys
    (``state_dict``, ``model``, ``teacher``, ``network_weights``, ...), and the children of a torchvision ResNet in
    an ``nn.Sequential`` (``encoder.0.weight``, ``encoder.4.0.conv1.weight``). Where the file holds several encoders,
    the second copies (:data:`SECONDARY_COPIES`) are passed over. ``path`` only names the file in messages.

    Raises:
        ValueError: ``state`` holds no tensors, no ResNet stem (``missing key 'conv1.weight'``, naming the file's
            first key) or several encoders none of which is the primary one.
    """
    if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
        raise ValueError(
            f"encoder weights {path} are not a state dict (expected a dict of tensors, got {type(state).__name__})"
        )
    flat = _flatten(state)
    if not any(isinstance(v, torch.Tensor) for v in flat.values()):
        first = next(iter(flat), None)
        raise ValueError(f"encoder weights {path}: value of key {first!r} is not a tensor (not a state dict)"
                         if first is not None else f"encoder weights {path} are not a state dict (no tensors)")
    found = _candidates(flat)
    if len(found) > 1:
        found = {p: s for p, s in found.items() if not _is_secondary(p)} or found
    if not found:
        first = next(iter(flat))
        raise ValueError(f"encoder weights {path}: missing key 'conv1.weight': no ResNet-50 in the file (its first "
                         f"key is {first!r}; expected torchvision's resnet50 layout, alone or under a prefix such as "
                         f"'module.encoder_q.' or 'backbone.')")
    if len(found) > 1:
        raise ValueError(f"encoder weights {path}: holds {len(found)} ResNet encoders (under "
                         f"{', '.join(repr(p) for p in sorted(found))}); save the one to load alone")
    return next(iter(found.items()))


def load_resnet50_weights(encoder: ResNet50Encoder, path: str) -> None:
    """Load the ResNet-50 of the local file ``path`` into ``encoder``.

    The file is a torchvision or timm ResNet-50 state dict, or a checkpoint holding one under a prefix or nested
    key (MoCo v2 / v3, DINO, BYOL, nnU-Net checkpoints of Med-DisSeg, ``nnUNetv2_meddisseg_pretrain``'s output:
    :func:`resnet50_state`). ``fc.*`` and ``layer4.*`` are ignored, and so is everything outside the encoder's
    prefix (projection and prediction heads, queues, momentum copies); a missing ``num_batches_tracked`` buffer
    keeps the encoder's value (older torchvision files lack it). If the encoder has ``input_channels != 3``
    and the file's ``conv1.weight`` has 3, the stem is adapted: mean over the RGB filters, repeated
    ``input_channels`` times. Never downloads anything.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: the file cannot be read as a state dict (``UnsafeTorchFile``: it holds other objects;
            it is read with ``weights_only=True``), or a key is missing / unexpected / has the wrong shape
            or NaN / inf values (the message names the file and the first bad key as the file spells it).
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"encoder weights file not found: {path}")
    try:
        loaded = load_weights_only(path, "encoder weights")
    except UnsafeTorchFile:
        raise
    except Exception as e:  # pickle errors, zip errors, ...
        raise ValueError(f"cannot read encoder weights {path} as a torch state dict: "
                         f"{' '.join(str(e).split()) or type(e).__name__}") from e
    prefix, state = resnet50_state(loaded, path)
    layout = "expected torchvision resnet50 layout" + (f" under {prefix!r}" if prefix else "")

    own = encoder.state_dict()
    new_state = {}
    for key, target in own.items():
        if key not in state:
            if key.endswith("num_batches_tracked"):
                new_state[key] = target
                continue
            raise ValueError(f"encoder weights {path}: missing key {prefix + key!r} ({layout})")
        value = state[key]
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"encoder weights {path}: value of key {prefix + key!r} is not a tensor (not a state "
                             f"dict)")
        if key == "conv1.weight" and value.ndim == 4 and value.shape[1] == 3 and target.shape[1] != 3:
            value = value.mean(dim=1, keepdim=True).repeat(1, target.shape[1], 1, 1)
        if value.shape != target.shape:
            raise ValueError(
                f"encoder weights {path}: shape mismatch for key {prefix + key!r}: "
                f"file {tuple(value.shape)} vs encoder {tuple(target.shape)}"
            )
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise ValueError(f"encoder weights {path}: key {prefix + key!r} holds NaN or inf values (expected finite "
                             f"weights)")
        new_state[key] = value
    for key in state:
        if key not in own and not _is_ignored(key):
            raise ValueError(f"encoder weights {path}: unexpected key {prefix + key!r} ({layout})")
    encoder.load_state_dict(new_state, strict=True)


def _imagenet_weights():
    from torchvision.models import ResNet50_Weights

    return ResNet50_Weights.IMAGENET1K_V1


def imagenet_weights_url() -> str:
    """URL of torchvision's ResNet-50 ``IMAGENET1K_V1`` state dict."""
    return _imagenet_weights().url


def imagenet_weights_file() -> str:
    """Where torchvision keeps that file: ``torch.hub.get_dir()/checkpoints/<file name of the URL>``
    (``$TORCH_HOME/hub/checkpoints/...`` when ``TORCH_HOME`` is set)."""
    name = os.path.basename(urlparse(imagenet_weights_url()).path)
    return os.path.join(torch.hub.get_dir(), "checkpoints", name)


def _offline_hint(cached: str) -> str:
    return (f"put the file from {imagenet_weights_url()} at {cached} (TORCH_HOME sets the folder), or pass "
            f"--encoder_weights PATH with a local torchvision ResNet-50 state dict")


def resolve_encoder_weights(weights: str) -> str:
    """The local file that ``weights`` (a path or :data:`IMAGENET`) names. Never downloads.

    Raises:
        FileNotFoundError: :data:`IMAGENET` is not in torch.hub's cache (the one-line message names
            the expected file, the URL and the ``--encoder_weights PATH`` alternative).
    """
    weights = os.fspath(weights)
    if weights != IMAGENET:
        return weights
    cached = imagenet_weights_file()
    if not os.path.isfile(cached):
        raise FileNotFoundError(f"encoder weights 'imagenet': torchvision's ResNet-50 IMAGENET1K_V1 file {cached} "
                                f"is not in the cache and training never downloads; run nnUNetv2_meddisseg_plan "
                                f"with --encoder_weights imagenet to download it, or {_offline_hint(cached)}")
    return cached


def download_imagenet_weights() -> str:
    """Return the cached ``IMAGENET1K_V1`` file, downloading it first through torchvision's weights API
    (``ResNet50_Weights.IMAGENET1K_V1.get_state_dict``: torch.hub's cache, hash checked) when absent.

    Raises:
        FileNotFoundError: the download failed (offline, ...); one line naming the expected file, the
            URL and the ``--encoder_weights PATH`` alternative.
    """
    cached = imagenet_weights_file()
    if os.path.isfile(cached):
        return cached
    try:
        _imagenet_weights().get_state_dict(progress=True, check_hash=True)
    except (OSError, RuntimeError) as e:  # URLError is an OSError; a hash mismatch a RuntimeError
        reason = " ".join(str(e).split()) or type(e).__name__
        raise FileNotFoundError(f"cannot download torchvision's ResNet-50 IMAGENET1K_V1 weights ({reason}); "
                                f"{_offline_hint(cached)}") from None
    if not os.path.isfile(cached):
        raise FileNotFoundError(f"torchvision did not leave its ResNet-50 IMAGENET1K_V1 weights at {cached}; "
                                f"{_offline_hint(cached)}")
    return cached
