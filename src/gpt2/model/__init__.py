"""The model: `GPT2`, the seeds' forward pass in PyTorch, and its files.

    pretrained  a checkpoint's tensors placed as the model keeps them, and a model's weights
                saved in Hugging Face's layout with its tokenizer
    model       config, attention, MLP, block, model, forward; and the doors users know
                (`from_pretrained`, `save_pretrained`, `generate`) delegating to `pretrained`
                and `gpt2.generation`

`import gpt2; gpt2.GPT2` is the public name; `model` imports `pretrained`, never the reverse.
"""
