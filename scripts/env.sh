# Source me: points the `ort` crate (load-dynamic) at the ONNX Runtime shipped by the PyPI wheel.
ORT_DYLIB_PATH="$(python3 -c 'import onnxruntime, os; print(os.path.join(os.path.dirname(onnxruntime.__file__), "capi", "libonnxruntime.so.1.31.1"))')"
export ORT_DYLIB_PATH
