"""Training and fine-tuning: `gpt2 train`.

    loggers      a run's records: log.jsonl, Weights & Biases, TensorBoard
    distributed  several processes under torchrun: the process group, DDP or FSDP, collectives
    stopping     Ctrl-C and SIGTERM: a stop at the same batch in every process
    checkpoint   OUT/checkpoint.pt: all a resume needs, in one file
    train        the loop: nanoGPT's recipe, resumable to the same curve

Imports run one way inside: `stopping` and `checkpoint` build on `distributed`, `train` on all.
"""
