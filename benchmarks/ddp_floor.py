"""The memory floor of data-parallel training: plain PyTorch, no data pipeline at all.

:mod:`benchmarks.scale` compares ``torchrun --nproc_per_node 2 qkv train`` with one process.
What any torchrun job pays whatever its data does is measured here: the same model (qkv's, from
a run's ``model.json``), trained for the same number of updates on batches of random ids of the
same token budget, by the shortest loop PyTorch allows: ``DistributedDataParallel`` under
torchrun, AdamW, ``F.cross_entropy``; no reading, no tokenizer, no validation, no checkpoint.
Each rank is a separate process that imports torch and holds its own replica of the model, its
gradients and AdamW's two moments; its ratio of two ranks to one process is the lowest a
torchrun job of this model can show.

Run: ``python -m benchmarks.ddp_floor --model RUN/final/model.json [--max-tokens 512]
[--steps 20] [--threads 2]``, or under ``torchrun --standalone --nproc_per_node 2 -m
benchmarks.ddp_floor ...`` (gloo). It prints ``K/N loss X`` per update (``benchmarks.scale``
times the first).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from qkv.nn.seq2seq import build_model


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--model", type=Path, required=True, help="a run's model.json")
    p.add_argument("--max-tokens", type=int, default=512, help="padded positions per batch")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--length", type=int, default=24, help="source and target length")
    args = p.parse_args(argv)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    torch.set_num_threads(args.threads)
    torch.manual_seed(int(os.environ.get("RANK", "0")))
    config = json.loads(args.model.read_text())["config"]
    model: nn.Module = build_model(config)
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    vocab, rows = config["tgt_vocab_size"], max(1, args.max_tokens // args.length)
    valid_lens = torch.full((rows,), args.length)
    for step in range(1, args.steps + 1):
        src = torch.randint(4, vocab, (rows, args.length))
        tgt = torch.randint(4, vocab, (rows, args.length + 1))
        logits = model(src, tgt[:, :-1], valid_lens)
        loss = F.cross_entropy(logits.reshape(-1, vocab), tgt[:, 1:].reshape(-1))
        del logits
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        print(f"{step}/{args.steps} loss {loss.item():.3f}", file=sys.stderr, flush=True)
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
