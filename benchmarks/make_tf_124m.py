"""Write a randomly initialised GPT-2 124M checkpoint in OpenAI's TensorFlow format, for
`benchmarks/load_memory.py --tf-checkpoint DIR`. Needs TensorFlow (unlike gpt2 itself):

    python3 -m venv /tmp/tfvenv && /tmp/tfvenv/bin/pip install tensorflow-cpu numpy
    /tmp/tfvenv/bin/python benchmarks/make_tf_124m.py /tmp/tf-124m
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "fixtures"))
from make_tf_gpt2_tiny import gpt2_shapes, save  # noqa: E402

HPARAMS = {"n_vocab": 50257, "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_layer": 12}


def main() -> None:
    out = Path(sys.argv[1])
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    tf.compat.v1.disable_eager_execution()
    rng = np.random.default_rng(0)
    values = {
        name: (0.02 * rng.standard_normal(shape)).astype(np.float32) for name, shape in gpt2_shapes(**HPARAMS).items()
    }
    save(tf, values, out)
    (out / "hparams.json").write_text(json.dumps(HPARAMS, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
