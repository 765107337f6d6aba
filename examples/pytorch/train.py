"""A small data-parallel training job for oomflight (docs/pytorch.md): a transformer LM on random tokens, no
dataset, under mpirun, one GPU per rank or several ranks sharing one GPU. Nothing in it knows about oomflight:

    mpirun -np 4 oomflight run -- python examples/pytorch/train.py --cap-rank 2 --cap-gib 1.5

Rank 2's memory is capped (torch.cuda.set_per_process_memory_fraction), so it raises a real
torch.OutOfMemoryError; oomflight, loaded by `oomflight run`, dumps every rank into one archive first.
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn


def world():
    """Rank, world size and local rank from Open MPI's (or torchrun's) environment."""
    env = os.environ
    rank = int(env.get("OMPI_COMM_WORLD_RANK", env.get("RANK", 0)))
    size = int(env.get("OMPI_COMM_WORLD_SIZE", env.get("WORLD_SIZE", 1)))
    local = int(env.get("OMPI_COMM_WORLD_LOCAL_RANK", env.get("LOCAL_RANK", 0)))
    return rank, size, local


class LM(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        block = nn.TransformerEncoderLayer(dim, heads, 4 * dim, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(block, layers)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens):
        return self.head(self.blocks(self.embed(tokens)))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--cap-rank", type=int, default=-1, help="the rank whose GPU memory is capped")
    p.add_argument("--cap-gib", type=float, default=1.0, help="that rank's cap, GiB")
    p.add_argument("--grow", type=float, default=1.25, help="batch growth per step on the capped rank")
    p.add_argument("--snapshot-dir", default="", help="record PyTorch's memory history and write its snapshots "
                   "there: rank{R}.step1.pickle after the second step, rank{R}.oom.pickle at an out-of-memory error")
    args = p.parse_args()

    rank, size, local = world()
    torch.cuda.set_device(local % torch.cuda.device_count())
    device = torch.device("cuda", torch.cuda.current_device())
    if args.snapshot_dir:
        os.makedirs(args.snapshot_dir, exist_ok=True)
        torch.cuda.memory._record_memory_history(max_entries=100000)
    if rank == args.cap_rank:
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.cap_gib * 2**30 / total), device)
    if size > 1:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29511")
        # NCCL needs one GPU per rank; ranks sharing a GPU use gloo (which all-reduces CUDA tensors too).
        backend = "nccl" if torch.cuda.device_count() >= size else "gloo"
        dist.init_process_group(backend, rank=rank, world_size=size)

    torch.manual_seed(0)
    model = LM(args.vocab, args.dim, args.layers, 8).to(device)
    if size > 1:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = args.batch
    times = []
    for step in range(args.steps):
        t0 = time.perf_counter()
        tokens = torch.randint(0, args.vocab, (batch, args.seq), device=device)
        try:
            logits = model(tokens[:, :-1])
            loss = nn.functional.cross_entropy(logits.reshape(-1, args.vocab), tokens[:, 1:].reshape(-1))
            loss.backward()
        except torch.OutOfMemoryError:
            if args.snapshot_dir:
                torch.cuda.memory._dump_snapshot(os.path.join(args.snapshot_dir, f"rank{rank}.oom.pickle"))
            raise
        opt.step()  # oomflight marks a batch at every optimizer step
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        if args.snapshot_dir and step == 1:
            torch.cuda.memory._dump_snapshot(os.path.join(args.snapshot_dir, f"rank{rank}.step1.pickle"))
        if rank == 0:
            print(f"step {step} loss {loss.item():.3f} {1000 * (time.perf_counter() - t0):.1f} ms "
                  f"reserved {torch.cuda.memory_reserved() / 2**30:.2f} GiB", flush=True)
        if rank == args.cap_rank:
            batch = int(batch * args.grow) + 1  # the capped rank's activations grow until they do not fit
    if rank == 0 and len(times) > 2:
        steady = sorted(times[2:])  # the first steps compile and warm the allocator
        allocations = torch.cuda.memory_stats(device).get("allocation.all.allocated", 0)
        print(f"median step {1000 * steady[len(steady) // 2]:.2f} ms over {len(steady)} steps "
              f"(p10 {1000 * steady[len(steady) // 10]:.2f} ms; {allocations / args.steps:.0f} allocations a step)",
              flush=True)
    if size > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
