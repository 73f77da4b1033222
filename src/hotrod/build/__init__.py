"""Building an artifact, in one room: `optimize.optimize` is `hotrod optimize`; `graphs` exports, fuses and
lowers every ONNX graph in the pass order (export, fuse, lower to the precision, finish for the CPU) and
describes the artifact; `onnx` is the onnxruntime build over it; `static_engine` is the torch static
engine's build (weights cast once, fp16's fp32 islands measured) and its reading back; `auto` chooses a
precision among the candidates both build."""
