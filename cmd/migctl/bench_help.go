package main

import "github.com/migctl/migctl/internal/bytesize"

// benchLong is the help of `migctl bench` and of each collective's command.
const benchLong = `Run a collective between N processes (ranks) and print, per message size, the time per
call, the algorithm and bus bandwidth (nccl-tests definitions) and the number of wrong elements.

The ranks are separate OS processes that meet through a gRPC rendezvous hosted by this command
and exchange data through shared host memory (/dev/shm): the path MIG instances need, because
they have no CUDA P2P or IPC between them. --backend host runs everything on the CPU (no GPU
needed); --backend gpu puts every rank's buffers on a CUDA device (by default all on device 0,
so N ranks share one GPU, which is how the MIG path is measured on a GPU without MIG).

With -c 1 every element of every rank's result is compared with the exactly predictable
expected value; the command exits non-zero if any is wrong or any rank fails.

All-reduces up to --small-bytes take the small-message path (every rank reduces every
input itself: one copy each way, one flag round); with --small-on device each rank's GPU
stream waits for the peers' flags and reduces their staged inputs itself, with no CPU step
between the copies (the JSON's smallOn says whether the device or the CPU carried the flags;
measured slower on an H200, so off by default). Copies in below 32 KiB go by a copy kernel
when 4 or more ranks share one CUDA device under MPS (they would queue on its copy engine),
else by the copy engines (the JSON's smallH2D; MIGCTL_H2D=kernel|2drows forces one). MIGCTL_TRACE=1 in
the environment makes rank 0 print, at the end, where the time of each size went: per step, the wait for other
ranks' flags, the time to issue it and the device's time to complete it (MIGCTL_TRACE=all:
every rank).

Sizes (-b, -e, --chunk, --small-bytes) are ` + bytesize.Units + `:
8KiB = 8192, 8KB = 8K = 8000. -b and -e must be multiples of the element size (4 for float).
Reduce-scatter and all-gather split each size into np equal blocks, rounding it down to a
multiple of np elements as nccl-tests do (the SIZE column shows the bytes measured); -b
must then give every rank at least one element (its default does).`

// benchExamples are the examples of `migctl bench --help` and of each
// collective's.
const benchExamples = `  # 4 ranks on the host backend, 8 KiB to 64 MiB, results checked element by element
  migctl bench allreduce --np 4 --backend host -b 8KiB -e 64MiB -f 8 -c 1

  # the MIG path measured on one GPU: 7 processes on CUDA device 0 through shared host memory
  migctl bench allreduce --np 7 --backend gpu --transport shm -b 256MiB -e 256MiB -n 10 -w 3

  # where the time of an 8 KiB all-reduce goes, step by step (printed by rank 0)
  MIGCTL_TRACE=1 migctl bench allreduce --np 7 --backend gpu --transport shm -b 8KiB -e 8KiB -n 1000

  # other collectives, other types and ops
  migctl bench reducescatter --np 3 --backend host --dtype bf16 --op max -c 1
  migctl bench broadcast --np 4 --backend host --root 2 -b 1MiB -e 1MiB -c 1 -o json

  # ranks started elsewhere: host the rendezvous here, join it from each rank
  migctl bench allreduce --np 2 --listen 127.0.0.1:7777 --token s3cret --local 0 &
  migctl bench allreduce --np 2 --rendezvous 127.0.0.1:7777 --token s3cret --rank 0 &
  migctl bench allreduce --np 2 --rendezvous 127.0.0.1:7777 --token s3cret --rank 1`
