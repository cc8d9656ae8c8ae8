"""What a model's files hold, read without torch: its config and its tensors, in every format.

    config         GPT2Config: a model's hyperparameters, the four sizes OpenAI released, and the
                   fixed table of sinusoidal positions
    tf_checkpoint  OpenAI's TensorFlow checkpoints, read with NumPy and the standard library
    gguf           llama.cpp's GGUF file of its `gpt2` architecture, written and read (through the
                   gguf package, imported where a file is)
    weights        finding a checkpoint (a name, a directory, a GGUF file, the hub) and reading its
                   tensors in every published format, under Hugging Face's names

Imports run one way inside: `gguf` reads through `config`; `weights` through `config`,
`tf_checkpoint` and `gguf`. Loading the
tensors into a torch model, and saving one, is `gpt2.model.pretrained`'s.
"""
