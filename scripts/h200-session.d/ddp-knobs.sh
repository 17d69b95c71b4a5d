#!/usr/bin/env bash
# After ddp-profile.sh (a DDP step's last gradient bucket is its exposed communication; its host
# reduction paces the copies back): the knobs that move that tail, 7 ranks on GPU 0 under MPS.
# Bench rows at DDP's bucket sizes (16, 48 MiB) with the default geometry, 4 reduce workers per
# rank, 1-MiB chunks; DDP GPT b4 with 25/10/5-MB buckets (migctl and gloo), 4 reduce workers, and
# the synchronisation-only probe; ResNet-18 b8 default, 4 workers, gradient_as_bucket_view, gloo.
# Build: make build lib; carry ["bin"]. Output: $OUT/knobs/summary.txt. ~6 minutes.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init knobs
say "$(lscpu | grep -E '^(Model name|CPU\(s\)|Thread\(s\) per core|Core\(s\) per socket|Socket\(s\)|NUMA node\(s\)|L3 cache)' | tr -s ' ' | paste -sd ';')"
for s in 16MiB 48MiB; do
  n=300; [ $s = 48MiB ] && n=100
  row "r7-$s" 7 $s $n 20
  row "r7-$s-w4" 7 $s $n 20 --reduce-workers 4
  row "r7-$s-c1M" 7 $s $n 20 --chunk 1MiB --slots 16
done
DDP_DEADLINE=520
for i in 1 2; do
  ddp "gpt4-migctl-$i" gpt 4 migctl
  ddp "gpt4-migctl-b10-$i" gpt 4 migctl --bucket-mb 10
  MIGCTL_TUNING=workers=4 ddp "gpt4-migctl-w4-$i" gpt 4 migctl
done
ddp gpt4-migctl-b5 gpt 4 migctl --bucket-mb 5
ddp gpt4-gloo gpt 4 gloo
ddp gpt4-gloo-b10 gpt 4 gloo --bucket-mb 10
ddp gpt4-sync gpt 4 migctl --probe-hook sync
for i in 1 2; do
  ddp "resnet8-migctl-$i" resnet 8 migctl
  MIGCTL_TUNING=workers=4 ddp "resnet8-migctl-w4-$i" resnet 8 migctl
  ddp "resnet8-view-$i" resnet 8 migctl --bucket-view
done
ddp resnet8-gloo resnet 8 gloo
