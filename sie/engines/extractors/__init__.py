"""Extract engines: GLiNER span extraction and ONNX token classification."""
