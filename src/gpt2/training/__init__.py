"""Training and fine-tuning: `gpt2 train`.

    loggers      a run's records: log.jsonl, Weights & Biases, TensorBoard
    distributed  several processes under torchrun: the process group, DDP or FSDP, collectives
    stopping     Ctrl-C and SIGTERM: a stop at the same batch in every process
    checkpoint   OUT/checkpoint.pt: all a resume needs, in one file
    optim        the optimizers (AdamW, Muon) and the learning rate's schedule
    plan         what a run is set up with, checked before its first iteration: the model, its chat
                 template, the memory and FLOPs a step takes, the benchmark it scores
    curves       OUT/loss.png, drawn from log.jsonl
    train        the loop: nanoGPT's recipe, resumable to the same curve

Imports run one way inside: `stopping` and `checkpoint` build on `distributed`, `plan` on both, `curves` on
`loggers`, `train` on all.
"""
