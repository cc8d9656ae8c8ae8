"""Export a model where GPT-2 is deployed: ONNX (`onnx`: ONNX Runtime, transformers.js) and GGUF
(`gguf`: llama.cpp). `gpt2 export` is the command over both."""
