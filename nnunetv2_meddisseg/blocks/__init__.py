"""Building blocks of Med-DisSeg, one module per family."""
from nnunetv2_meddisseg.blocks.activation import TeLU, get_activation, telu
from nnunetv2_meddisseg.blocks.attention import CBAT, ELAT, ChannelAttention, SpatialAttention
from nnunetv2_meddisseg.blocks.cdfa import ContrastDrivenAggregation, ContrastGuidancePyramid
from nnunetv2_meddisseg.blocks.conv import ConvNormAct
from nnunetv2_meddisseg.blocks.decoder import CBATDecoder, ConcatFusionHead, MultiScaleCBATDecoder, PathHead
from nnunetv2_meddisseg.blocks.decoupling import AuxiliaryHeads, FeatureDecoupling
from nnunetv2_meddisseg.blocks.encoder import ResNet50Encoder, load_resnet50_weights
from nnunetv2_meddisseg.blocks.enhancement import FeatureEnhancement

__all__ = ["TeLU", "telu", "get_activation", "ConvNormAct", "ResNet50Encoder", "load_resnet50_weights",
           "ChannelAttention", "SpatialAttention", "CBAT", "ELAT", "FeatureEnhancement", "FeatureDecoupling",
           "AuxiliaryHeads", "ContrastDrivenAggregation", "ContrastGuidancePyramid", "CBATDecoder", "PathHead",
           "ConcatFusionHead", "MultiScaleCBATDecoder"]
