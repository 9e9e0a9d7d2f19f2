"""A tensor-parallel decode whose rank ``FAIL_RANK`` fails at its third model call
(``python -m helpers.dying_rank``, one process per rank with torchrun's environment;
tests/test_parallel_failures.py). It joins the run as the lm-eval adapter does
(``lmeval.parallel.Ranks``), without lm-eval's import time. Every rank prints ``decoding``
before it decodes."""

from __future__ import annotations

import os


def main() -> None:
    from pvf_lmeval.decoding import decode_batch
    from pvf_lmeval.lmeval.parallel import Ranks
    from pvf_lmeval.lmeval.settings import parse_parallel
    from pvf_lmeval.models import load_model

    ranks = Ranks.launch(parse_parallel({"tensor_parallel_size": 2}), "cpu")
    model = load_model("tiny-llada", device="cpu", comm=ranks.comm)
    if ranks.rank == int(os.environ["FAIL_RANK"]):
        real, calls = model.logits, []

        def failing(*args, **kwargs):
            calls.append(1)
            if len(calls) == 3:
                raise RuntimeError(f"injected failure at call {len(calls)}")
            return real(*args, **kwargs)

        model.logits = failing
    print("decoding", flush=True)
    decode_batch(model, [[40, 41, 42], [7, 8]], "static", gen_length=64, block_length=8, steps=16,
                 early_stop=False)
    print("finished", flush=True)


if __name__ == "__main__":
    main()
