"""DDP (or FSDP, --fsdp) on a small GPT language model on synthetic tokens
(fixed seeds). Default: 6 layers, d_model 512, 8 heads, seq 256, vocab 16384
(about 27M parameters, tied embeddings).

    migctl run --gpus 0 --np 7 -- python examples/pytorch/ddp_gpt.py --backend migctl --batch 32
    migctl run --gpus 0 --np 7 -- python examples/pytorch/ddp_gpt.py --backend migctl --batch 4 --fsdp

Rank 0 prints one JSON line (steps/s of the slowest rank, losses of the
first steps, parameter checksum, whether all ranks agree)."""

import math

import torch
import torch.nn as nn

import common


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab, d, layers, heads, seq):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(1, seq, d))
        self.blocks = nn.ModuleList([Block(d, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(d)
        self.register_buffer("mask", torch.triu(torch.full((seq, seq), float("-inf")), 1), persistent=False)
        nn.init.normal_(self.tok.weight, std=0.02)
        nn.init.normal_(self.pos, std=0.02)

    def forward(self, idx):
        x = self.tok(idx) + self.pos[:, : idx.shape[1]]
        m = self.mask[: idx.shape[1], : idx.shape[1]]
        for b in self.blocks:
            x = b(x, m)
        return self.ln(x) @ self.tok.weight.t()  # tied output head


def main():
    ap = common.parser(__doc__)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=16384)
    ap.add_argument("--pool", type=int, default=4, help="distinct synthetic batches cycled through")
    ap.add_argument("--fsdp", action="store_true", help="FullyShardedDataParallel instead of DDP (torch 2.x)")
    args = ap.parse_args()
    rank, world, device = common.setup(args)
    torch.manual_seed(args.seed)
    model = GPT(args.vocab, args.d_model, args.layers, args.heads, args.seq).to(device)
    g = torch.Generator().manual_seed(args.seed + 1000 * rank + 1)
    batches = []
    for _ in range(args.pool):
        t = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=g).to(device)
        batches.append((t[:, :-1].contiguous(), t[:, 1:].contiguous()))
    n = sum(p.numel() for p in model.parameters())
    if args.fsdp and args.backend != "none":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        model = FSDP(model, device_id=device if device.type == "cuda" else None, use_orig_params=True)
    else:
        model = common.wrap(model, args, device)

    def loss_fn(logits, y):
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

    common.train("gpt", args, model, batches, loss_fn, rank, world, device,
                 extra={"params": n, "params_millions": round(n / 1e6, 2), "fsdp": args.fsdp,
                        "layers": args.layers, "d_model": args.d_model, "seq": args.seq,
                        "loss_at_uniform": round(math.log(args.vocab), 3)})


if __name__ == "__main__":
    main()
