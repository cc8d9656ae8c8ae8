"""gpt2's dictionary training against SAELens's own trainer (issue 54): the same activations, the
same settings and the same starting weights; explained variance and L0 on held-out activations,
and the training's wall time.

    .venv/bin/python benchmarks/dictionaries.py [--model tests/fixtures/induction_2l] [--site h.1.resid_mid]
        [--architecture topk] [--expansion 8] [--k 16] [--steps 500] [--batch-size 2048] [--threads 2]

The activations: the model run over windows of --data (a prepared dataset; for the induction model, made here
with `gpt2 prepare --synthetic induction` when not given) by gpt2's ActivationStream (position 0 left out,
shuffled), collected once into memory: --steps batches for training, a tenth more held out. Both sides then
read the very same batches in the same order:

  gpt2:   DictionaryTrainer([Dictionary(config)], lr, dead_feature_window).step(...) per batch
  SAELens: SAETrainer(SAETrainerConfig(...), its TrainingSAE, data_provider=the batches).fit(), the SAE's
          weights first set to gpt2's Dictionary's starting ones (SAELens's own initialisation, which
          gpt2's follows, draws other random numbers)

Settings both take: SAELens's defaults (Adam 0.9/0.999, constant lr, clip norm 1, dead_feature_window 1000,
apply_b_dec_to_input for an SAE), --lr, and the architecture's coefficients (--l1, --l0, --k; topk:
rescale_acts_by_decoder_norm off). Held out: explained variance (1 - sum |x - x_hat|^2 / sum |x - mean|^2)
and L0. Times: the training loops alone, after a warm-up step of each, threads fixed.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TQDM_DISABLE", "1")

import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def activations(args) -> torch.Tensor:
    """(steps + steps // 10, batch_size, C): the site's activations, batches in order."""
    from gpt2 import GPT2
    from gpt2.data.files import open_data
    from gpt2.inspect.dictionary_training import ActivationStream, TrainingSettings, check_site

    model = GPT2.from_pretrained(args.model, device="cpu")
    data = args.data
    if data is None:
        data = Path(tempfile.mkdtemp(prefix="dictionaries-")) / "data"
        command = [sys.executable, "-m", "gpt2", "prepare", "--out", str(data), "--synthetic", "induction"]
        subprocess.run(command, check=True, capture_output=True)
    site = check_site(model, args.site)
    settings = TrainingSettings(batch_size=args.batch_size, context=min(64, model.config.n_ctx), windows=32)
    stream = iter(ActivationStream(model, open_data(data), [site], settings))
    return torch.stack([next(stream)[:, 0] for _ in range(args.steps + args.steps // 10)])


def held_out(encode, decode, x: torch.Tensor) -> tuple[float, float]:
    """(explained variance, L0) of a dictionary on x (N, C)."""
    with torch.no_grad():
        f = encode(x)
        out = decode(f)
    return (1 - (x - out).pow(2).sum() / (x - x.mean(0)).pow(2).sum()).item(), (f != 0).float().sum(-1).mean().item()


def run_gpt2(config, start: dict, batches: torch.Tensor, args):
    from gpt2.inspect.dictionaries import Dictionary
    from gpt2.inspect.dictionary_training import DictionaryTrainer

    d = Dictionary(config)
    d.load_state_dict(start)
    trainer = DictionaryTrainer([d], args.lr, 1000)
    began = time.perf_counter()
    for batch in batches:
        trainer.step([(batch, batch)])
    return d, time.perf_counter() - began


def saelens_sae(config, args):
    import sae_lens

    common = dict(d_in=config.d_in, d_sae=config.d_dict, apply_b_dec_to_input=True, decoder_init_norm=0.1)
    if config.architecture == "standard":
        return sae_lens.StandardTrainingSAE(sae_lens.StandardTrainingSAEConfig(l1_coefficient=args.l1, **common))
    if config.architecture == "jumprelu":
        cfg = sae_lens.JumpReLUTrainingSAEConfig(l0_coefficient=args.l0, **common)
        return sae_lens.JumpReLUTrainingSAE(cfg)
    cfg = sae_lens.TopKTrainingSAEConfig(k=args.k, rescale_acts_by_decoder_norm=False, **common)
    return sae_lens.TopKTrainingSAE(cfg)


def run_saelens(config, start: dict, batches: torch.Tensor, args):
    from sae_lens import SAETrainer
    from sae_lens.config import LoggingConfig, SAETrainerConfig

    sae = saelens_sae(config, args)
    with torch.no_grad():
        for name, value in start.items():
            getattr(sae, name).copy_(value)
    cfg = SAETrainerConfig(
        total_training_samples=len(batches) * args.batch_size,
        train_batch_size_samples=args.batch_size,
        lr=args.lr,
        lr_end=args.lr,  # constant: SAELens's runner sets it so
        device="cpu",
        dead_feature_window=1000,
        feature_sampling_window=10**9,
        logger=LoggingConfig(log_to_wandb=False),
    )
    trainer = SAETrainer(cfg, sae, data_provider=iter(batches))
    began = time.perf_counter()
    trainer.fit()
    return sae, time.perf_counter() - began


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(REPO / "tests" / "fixtures" / "induction_2l"))
    parser.add_argument("--data", default=None, help="a prepared dataset in the model's ids (default: induction's)")
    parser.add_argument("--site", default="h.1.resid_mid")
    parser.add_argument("--architecture", choices=["standard", "jumprelu", "topk"], default="topk")
    parser.add_argument("--expansion", type=int, default=8)
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument("--l1", type=float, default=5.0)
    parser.add_argument("--l0", type=float, default=1.0)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--batch-size", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from gpt2.inspect.dictionaries import Dictionary, DictionaryConfig

    acts = activations(args)
    train, test = acts[: args.steps], acts[args.steps :].flatten(0, 1)
    C = acts.size(-1)
    config = DictionaryConfig(
        args.architecture, d_in=C, d_dict=args.expansion * C, k=args.k, l1_coefficient=args.l1, l0_coefficient=args.l0
    )
    start = {k: v.clone() for k, v in Dictionary(config, torch.Generator().manual_seed(0)).state_dict().items()}
    run_gpt2(config, start, train[:1], args), run_saelens(config, start, train[:1], args)  # warm-up
    ours, ours_s = run_gpt2(config, start, train, args)
    theirs, theirs_s = run_saelens(config, start, train, args)
    ev_ours, l0_ours = held_out(ours.encode, ours.decode, test)
    ev_theirs, l0_theirs = held_out(theirs.encode, theirs.decode, test)
    print(
        f"{platform.machine()}, {os.cpu_count()} cores, torch threads {args.threads}; {args.model} {args.site} "
        f"(C={C}), {args.architecture} d_dict={config.d_dict}, {args.steps} steps of {args.batch_size}"
    )
    print(f"gpt2:    explained variance {ev_ours:.4f}  L0 {l0_ours:7.2f}  {ours_s:7.2f} s")
    print(f"SAELens: explained variance {ev_theirs:.4f}  L0 {l0_theirs:7.2f}  {theirs_s:7.2f} s")
    print(f"gpt2 trains at {theirs_s / ours_s:.2f}x SAELens's speed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
