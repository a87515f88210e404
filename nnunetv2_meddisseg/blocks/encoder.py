"""ResNet-50 encoder (stem + layer1..layer3) in torchvision's state-dict layout, and its weight loader.

It keeps ResNet's ReLU whatever ``activation`` says, so ImageNet weights stay meaningful; ``layer4`` is not built.
Weights: a local state-dict file or ``IMAGENET`` (torchvision's ``IMAGENET1K_V1``, as in the paper's code) in
torch.hub's cache. Only ``download_imagenet_weights`` (the plan command) downloads; the rest fails naming the file.
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
    """ResNet v1.5 bottleneck (stride on the 3x3 conv): (B, C, H, W) -> (B, 4 * width, H / stride, W / stride)."""

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
    """ResNet-50 stem + layer1..layer3; keys as in torchvision's ``resnet50().state_dict()`` less ``layer4``, ``fc``.

    x: (B, input_channels, H, W), H and W divisible by 16 -> [x1 (B, 64, H/2, W/2) before the max-pool,
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
            blocks = [Bottleneck(in_channels, width, stride, conv_op, norm_op, norm_op_kwargs)]
            in_channels = width * Bottleneck.expansion
            blocks += [Bottleneck(in_channels, width, 1, conv_op, norm_op, norm_op_kwargs) for _ in range(n_blocks - 1)]
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


#: key-prefix parts naming an encoder's second copy (MoCo's key encoder, DINO's student, an EMA copy), as do parts
#: starting with ``SECONDARY_STARTS``; such copies are passed over where a file holds several encoders
SECONDARY_COPIES = frozenset({"encoder_k", "student", "state_dict_ema", "model_ema"})
SECONDARY_STARTS = ("momentum", "target", "ema")

#: stage positions of ``torchvision.models.resnet50`` in ``nn.Sequential(*resnet.children())`` (BYOL-style keys)
_CHILDREN = {"0": "conv1", "1": "bn1", "4": "layer1", "5": "layer2", "6": "layer3", "7": "layer4"}

#: a ``conv1.weight`` inside a bottleneck (``layer1.0.conv1.weight``, ``4.0.conv1.weight``), not the stem
_BLOCK_PREFIX = re.compile(r"(^|\.)(layer)?\d+\.\d+\.$")


def _flatten(state: dict, prefix: str = "") -> Dict[str, object]:
    """Join nested dicts of string keys into dotted keys; dicts with other keys (optimizer state) are dropped."""
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
    """``{prefix: its keys in torchvision's names}`` per ResNet stem: ``<prefix>conv1.weight`` (torchvision, timm) or
    ``<prefix>0.weight`` next to ``<prefix>4.0.conv1.weight`` (a ResNet's children in an ``nn.Sequential``)."""
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
    """The ResNet-50 in a loaded weights file ``state``: ``(prefix, its keys in torchvision's names)``.

    Reads torchvision and timm names under any prefix (``module.encoder_q.``, ...) and nesting of string-keyed dicts
    (``state_dict``, ``teacher``, ...), and a ResNet's children in an ``nn.Sequential``; of several encoders, second
    copies are passed over. ``path`` only names the file in messages. Raises ValueError if it finds no tensors, no
    ResNet stem, or several encoders none of them primary.
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
    """Load the ResNet-50 of the local file ``path`` into ``encoder``; never downloads.

    Reads what ``resnet50_state`` reads (MoCo, DINO, BYOL, Med-DisSeg, ``nnUNetv2_meddisseg_pretrain`` checkpoints).
    ``fc.*``, ``layer4.*`` and keys outside the encoder's prefix are ignored; a missing ``num_batches_tracked`` keeps
    the encoder's value (older torchvision files lack it). A 3-channel ``conv1.weight`` becomes the mean RGB filter,
    repeated ``input_channels`` times.

    Raises FileNotFoundError if ``path`` is missing; ValueError if it is not a state dict (``UnsafeTorchFile`` if it
    holds other objects) or a key is missing, unexpected, misshaped or NaN / inf.
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
        if key not in own and not key.startswith(("fc.", "layer4.")):
            raise ValueError(f"encoder weights {path}: unexpected key {prefix + key!r} ({layout})")
    encoder.load_state_dict(new_state, strict=True)


def _imagenet_weights():
    from torchvision.models import ResNet50_Weights

    return ResNet50_Weights.IMAGENET1K_V1


def imagenet_weights_url() -> str:
    """URL of torchvision's ResNet-50 ``IMAGENET1K_V1`` state dict."""
    return _imagenet_weights().url


def imagenet_weights_file() -> str:
    """Where torchvision caches the ``IMAGENET1K_V1`` file: ``torch.hub.get_dir()/checkpoints/<URL's file name>``."""
    name = os.path.basename(urlparse(imagenet_weights_url()).path)
    return os.path.join(torch.hub.get_dir(), "checkpoints", name)


def _offline_hint(cached: str) -> str:
    return (f"put the file from {imagenet_weights_url()} at {cached} (TORCH_HOME sets the folder), or pass "
            f"--encoder_weights PATH with a local torchvision ResNet-50 state dict")


def resolve_encoder_weights(weights: str) -> str:
    """The local file ``weights`` (a path or ``IMAGENET``) names; FileNotFoundError if ``IMAGENET`` is not cached."""
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
    """The cached ``IMAGENET1K_V1`` file, downloaded (hash checked) if absent; FileNotFoundError if download fails."""
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
