"""What a model's files hold, read without torch: its config and its tensors, in every format.

    config         GPT2Config: a model's hyperparameters, and the four sizes OpenAI released
    tf_checkpoint  OpenAI's TensorFlow checkpoints, read with NumPy and the standard library
    weights        finding a checkpoint (a name, a directory, the hub) and reading its tensors
                   in every published format, under Hugging Face's names

Imports run one way inside: `weights` reads through `config` and `tf_checkpoint`. Loading the
tensors into a torch model, and saving one, is `gpt2.model.pretrained`'s.
"""
