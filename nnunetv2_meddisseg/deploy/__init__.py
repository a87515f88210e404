"""Deployment without PyTorch: ONNX export of trained 2D models (with INT8 / bf16 under an accuracy guard) and a
predictor on OpenVINO or ONNX Runtime."""
