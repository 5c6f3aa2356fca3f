"""Where a decoder step's time goes, measured through ONNX Runtime."""
