"""Deployment without PyTorch: ONNX export of trained 2D models and an ONNX Runtime predictor."""
