"""Point-to-point transfers (dist.send/recv/isend/irecv, batch_isend_irecv)
on the migctl backend, across the real processes of `migctl run` (2 ranks
or more; CPU tensors, or CUDA with --device cuda):

    migctl run --backend host --np 3 -- python3 python/tests/p2p_check.py

- a ring where every rank sends to the next before it receives from the
  previous (isend/irecv, and batch_isend_irecv), every dtype, sizes 0, 1 and
  65539, contiguous and strided tensors, exact results;
- messages between two ranks arrive in the order they were sent; a Future
  of an irecv completes with the tensor;
- a transfer pending on one rank while every rank runs all-reduces: neither
  waits for the other;
- within a group of some of the ranks (dst/src are job ranks, as torch has
  them);
- a two-stage pipeline (forward activations one way, their gradients back)
  gives the gradients of the same model run whole in one process;
- bad peers raise ValueError, recv_anysource NotImplementedError.

In a job across nodes (2 nodes x 2 ranks in CI) the ring runs within each
node, the group of some ranks spans nodes and a transfer across nodes raises
NotImplementedError.

Prints one JSON line per rank; exits 1 on a failure."""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402

import migctl_torch  # noqa: E402,F401
import migctl_torch.multinode as multinode  # noqa: E402

failures = []
checks = 0

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.uint8,
          torch.int8, torch.bool]


def expect(name, got, want):
    global checks
    checks += 1
    if not torch.equal(got.cpu(), want.cpu()):
        failures.append(f"{name}: got {got.cpu().flatten()[:8].tolist()}, want {want.cpu().flatten()[:8].tolist()}")


def expect_true(name, ok, detail=""):
    global checks
    checks += 1
    if not ok:
        failures.append(f"{name}: {detail}")


def message(src, k, n, dtype, dev):
    """The k-th message from rank src: n elements, distinct per rank and k."""
    x = torch.arange(n, dtype=torch.int64) % 97 + src * 3 + k
    if dtype == torch.bool:
        return (x % 2 == 1).to(dev)
    return x.to(dtype).to(dev)


def ring(rank, members, dev):
    """Every member sends to the next member and receives from the previous."""
    world, me = len(members), members.index(rank)
    nxt, prev = members[(me + 1) % world], members[(me - 1) % world]
    k = 0
    for dtype in DTYPES:
        for n in (0, 1, 65539):
            k += 1
            out = torch.zeros(n, dtype=dtype, device=dev)
            s = dist.isend(message(rank, k, n, dtype, dev), nxt)
            r = dist.irecv(out, prev)
            r.wait()
            s.wait()
            expect(f"ring {dtype} n={n}", out, message(prev, k, n, dtype, dev))
    # strided: a column of a matrix sent, received into another column
    src = torch.arange(40, dtype=torch.float32, device=dev).reshape(8, 5) + rank
    dst = torch.zeros(8, 5, device=dev)
    s = dist.isend(src[:, 2], nxt)
    dist.recv(dst[:, 3], prev)
    s.wait()
    expect("ring strided", dst[:, 3], torch.arange(40, dtype=torch.float32, device=dev).reshape(8, 5)[:, 2] + prev)
    expect("ring strided leaves the rest", dst[:, [0, 1, 2, 4]], torch.zeros(8, 4, device=dev))
    # batch_isend_irecv, both directions
    a, b = torch.zeros(33, device=dev), torch.zeros(33, device=dev)
    ops = [dist.P2POp(dist.isend, message(rank, 100, 33, torch.float32, dev), nxt),
           dist.P2POp(dist.isend, message(rank, 101, 33, torch.float32, dev), prev),
           dist.P2POp(dist.irecv, a, prev),
           dist.P2POp(dist.irecv, b, nxt)]
    if world == 2:  # next and previous are one rank: two messages each way, in order
        ops = [ops[0], ops[2], ops[1], ops[3]]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    if world == 2:
        expect("batch_isend_irecv first", a, message(prev, 100, 33, torch.float32, dev))
        expect("batch_isend_irecv second", b, message(nxt, 101, 33, torch.float32, dev))
    else:
        expect("batch_isend_irecv from previous", a, message(prev, 100, 33, torch.float32, dev))
        expect("batch_isend_irecv from next", b, message(nxt, 101, 33, torch.float32, dev))


def order_and_independence(rank, world, dev):
    if rank == 0:
        works = [dist.isend(message(0, k, 100, torch.float32, dev), 1) for k in range(5)]
        t = torch.ones(4, device=dev)
        dist.all_reduce(t)  # rank 1 receives only after it: the sends are pending meanwhile
        expect("all-reduce beside pending sends", t, torch.full((4,), float(world), device=dev))
        for w in works:
            w.wait()
    elif rank == 1:
        t = torch.ones(4, device=dev)
        dist.all_reduce(t)
        expect("all-reduce before the receives", t, torch.full((4,), float(world), device=dev))
        outs = [torch.zeros(100, device=dev) for _ in range(5)]
        futs = [dist.irecv(o, 0).get_future() for o in outs]
        for k, (o, f) in enumerate(zip(outs, futs)):
            got = f.wait()
            expect(f"message {k} in order", o, message(0, k, 100, torch.float32, dev))
            expect_true(f"future {k} holds the tensor", isinstance(got, list) and len(got) == 1 and got[0] is o,
                        repr(type(got)))
    else:
        t = torch.ones(4, device=dev)
        dist.all_reduce(t)
        expect("all-reduce", t, torch.full((4,), float(world), device=dev))
    dist.barrier()


def subgroup(rank, world, dev):
    members = [world - 1, 0]  # listed high first
    g = dist.new_group(ranks=members)
    if multinode.spans_nodes():  # the first and last rank are on two nodes
        if rank in members:
            try:
                dist.send(torch.zeros(2, device=dev), 0 if rank else world - 1, group=g)
                failures.append("a transfer across nodes: no error")
            except NotImplementedError as e:
                expect_true("a transfer across nodes", "node" in str(e), str(e))
        dist.barrier()
        return
    if rank == world - 1:
        dist.send(message(rank, 7, 9, torch.int64, dev), 0, group=g)
    elif rank == 0:
        out = torch.zeros(9, dtype=torch.int64, device=dev)
        dist.recv(out, world - 1, group=g)
        expect("send within a group of some ranks", out, message(world - 1, 7, 9, torch.int64, dev))
    dist.barrier()


def pipeline(rank, dev):
    """Two stages on ranks 0 and 1, checked against the whole model in one process."""
    torch.manual_seed(0)
    first, second = nn.Linear(16, 32), nn.Linear(32, 4)
    x, y = torch.randn(8, 16), torch.randn(8, 4)
    # the whole model here, for reference
    ref1, ref2 = nn.Linear(16, 32), nn.Linear(32, 4)
    ref1.load_state_dict(first.state_dict())
    ref2.load_state_dict(second.state_dict())
    nn.functional.mse_loss(ref2(torch.relu(ref1(x))), y).backward()
    first, second, x, y = first.to(dev), second.to(dev), x.to(dev), y.to(dev)
    if rank == 0:
        h = torch.relu(first(x))
        dist.send(h.detach(), 1)
        grad = torch.empty_like(h)
        dist.recv(grad, 1)
        h.backward(grad)
        expect_true("pipeline stage 0 gradient", torch.allclose(first.weight.grad.cpu(), ref1.weight.grad, atol=1e-6),
                    f"max diff {(first.weight.grad.cpu() - ref1.weight.grad).abs().max().item()}")
    elif rank == 1:
        h = torch.empty(8, 32, device=dev)
        dist.recv(h, 0)
        h.requires_grad_()
        nn.functional.mse_loss(second(h), y).backward()
        dist.send(h.grad, 0)
        expect_true("pipeline stage 1 gradient", torch.allclose(second.weight.grad.cpu(), ref2.weight.grad, atol=1e-6),
                    f"max diff {(second.weight.grad.cpu() - ref2.weight.grad).abs().max().item()}")
    dist.barrier()


def refusals(rank, world, dev):
    t = torch.zeros(2, device=dev)
    for name, call in (("send to itself", lambda: dist.send(t, rank)),
                       ("recv from itself", lambda: dist.recv(t, rank))):
        try:
            call()
            failures.append(f"{name}: no error")
        except (ValueError, RuntimeError) as e:  # ours names the peer; torch 2.x refuses it before the backend
            expect_true(name, any(w in str(e) for w in ("peer", "itself", "same as the rank")), str(e))
    try:
        dist.recv(t)  # from any source
        failures.append("recv_anysource: no error")
    except NotImplementedError as e:
        expect_true("recv_anysource", "recv_anysource" in str(e), str(e))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if a.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
        dev = torch.device("cuda", torch.cuda.current_device())
    else:
        dev = torch.device("cpu")
    dist.init_process_group("migctl")
    n, nodes, _, local = multinode.nodes()
    ring(rank, list(range(n * local, (n + 1) * local)) if nodes > 1 else list(range(world)), dev)
    order_and_independence(rank, world, dev)
    subgroup(rank, world, dev)
    pipeline(rank, dev)
    refusals(rank, world, dev)
    dist.barrier()
    print(json.dumps({"rank": rank, "nodes": nodes, "checks": checks, "failures": failures}), flush=True)
    dist.destroy_process_group()
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
