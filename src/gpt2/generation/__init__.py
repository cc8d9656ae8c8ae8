"""Generation: from a model's next-token logits to text.

    sampling  choosing a token (greedy, temperature, top-k, top-p), speculative decoding's rule, seeds
    processors  what bends a row's scores before it chooses: constraints (structured outputs), logit
              bias, penalties, each row with its own state
    lookup    prompt-lookup speculation: drafts copied from a row's own earlier tokens
    kernels   the CPU decode kernels (`python -m gpt2.generation.kernels` compiles them) and the
              linear layer's dispatch, the narrow (bfloat16, float16, int8) weights it reads
    decoding  the token loop: rows in the slots of an engine, prefilled together and in chunks
    caches    what an engine keeps of its rows: the `Model` it drives, the KV cache, the prefix cache
    graphs    decoding steps captured and replayed as CUDA graphs
    engines   what turns a model into logits for that loop: the torch engine, the NumPy engine, the
              engine each model keeps, which engine runs where
    generate  text in, text out, streamed: `generate_text`, `stream_text`, `Chat`

Imports run one way inside: `decoding` builds on `sampling`, `processors` and `lookup`, `graphs`
on `caches`, `engines` on `decoding`, `caches` and `graphs`, `generate` on all of them; `kernels`
stands alone. None of them imports `gpt2.model`: an engine drives any model through its methods
(`caches.Model`).
"""
