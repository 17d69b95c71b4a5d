"""The C ABI of libmigctl.so (include/migctl.h) through ctypes, without
torch: init, rank/size, every collective on host memory, handles (wait, test,
bad handle), migctl_run (issue and wait in one call; in order behind the
collectives in flight), error codes with their text, the counters (migctl_stats), the
fork guard, finalize. Run under
`migctl run --backend host --np 3`. Prints one JSON line; exits 1 on failure."""

import ctypes
import importlib.util
import json
import os
import signal
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("migctl_lib", os.path.join(here, "..", "migctl_torch", "_lib.py"))
L = importlib.util.module_from_spec(spec)
spec.loader.exec_module(L)

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


def main():
    lib = L.load()
    c = lib.lib
    err = lambda: (c.migctl_last_error() or b"").decode()  # noqa: E731
    h = ctypes.c_uint64(0)

    check(c.migctl_abi_version() == L.ABI_VERSION, "abi version")
    check(c.migctl_rank() == -1 and "not initialised" in err(), f"rank before init: {err()}")
    check(c.migctl_barrier(ctypes.byref(h)) == L.ERR_NOT_INITIALIZED, "barrier before init")
    check(c.migctl_run(L.KIND_BARRIER, None, None, 0, 0, 0, 0, 0, 0) == L.ERR_NOT_INITIALIZED, "run before init")
    check(c.migctl_set_timeout(1000) == L.ERR_NOT_INITIALIZED, "set_timeout before init")
    check(c.migctl_queued_broadcast_bytes(0) == L.ERR_NOT_INITIALIZED, "queued_broadcast_bytes before init")
    check(c.migctl_completes_early(0) == L.ERR_NOT_INITIALIZED, "completes_early before init")
    check(c.migctl_init_group(2, 2, b"unix://@x", b"x") == L.ERR_INVALID and "rank < size" in err(),
          f"init_group with rank >= size: {err()}")
    check(c.migctl_serve(0, ctypes.create_string_buffer(64), 64) == L.ERR_INVALID, "serve 0 ranks")
    check(c.migctl_serve(1, ctypes.create_string_buffer(8), 8) == L.ERR_INVALID and "bytes" in err(),
          f"serve into too small a buffer: {err()}")
    addr = lib.serve(2)  # a node's rendezvous (multi-node jobs); this process only hosts it
    check(addr.startswith("unix://@migctl-node-"), f"serve address {addr}")
    check(c.migctl_serve(2, ctypes.create_string_buffer(64), 64) == L.ERR_INVALID and "already" in err(),
          f"second serve: {err()}")
    check(c.migctl_init_from_env() == L.OK, f"init: {err()}")
    check(c.migctl_init_from_env() == L.ERR_ALREADY_INITIALIZED, "second init")
    check(c.migctl_init_group(0, 1, addr.encode(), b"x") == L.ERR_ALREADY_INITIALIZED, "init_group after init")
    rank, size = c.migctl_rank(), c.migctl_size()
    check(rank == int(os.environ["RANK"]) and size == int(os.environ["WORLD_SIZE"]), f"rank {rank} size {size}")
    check(c.migctl_on_gpu() == 0, "host backend")
    check(c.migctl_queued_broadcast_bytes(0) == 0, f"host backend queues broadcasts: {err()}")
    check(c.migctl_queued_broadcast_bytes(999) < 0 and "group" in err(), f"queued_broadcast_bytes(999): {err()}")
    # the host backend never completes early, whatever the tuning says (abi_check runs with and without it)
    check(c.migctl_completes_early(0) == 0, f"host backend completes early: {err()}")
    check(c.migctl_completes_early(999) < 0 and "group" in err(), f"completes_early(999): {err()}")
    check(c.migctl_set_timeout(0) == L.ERR_INVALID and "positive" in err(), f"set_timeout(0): {err()}")
    check(c.migctl_set_timeout(-5) == L.ERR_INVALID, "set_timeout(-5)")
    check(c.migctl_set_timeout(120000) == L.OK, f"set_timeout(120 s): {err()}")

    def wait(code, what):
        check(code == L.OK, f"{what}: issue: {code} {err()}")
        code = c.migctl_wait(h.value, -1)
        check(code == L.OK, f"{what}: wait: {code} {err()}")

    # allreduce, out of place, float64 max
    n = 5
    a = (ctypes.c_double * n)(*[rank * 10 + i for i in range(n)])
    b = (ctypes.c_double * n)()
    wait(c.migctl_allreduce(a, b, n, L.FLOAT64, L.MAX, L.HOST, 0, ctypes.byref(h)), "allreduce")
    check(list(b) == [(size - 1) * 10 + i for i in range(n)], f"allreduce max: {list(b)}")
    # int32 sum in place, polled with migctl_test
    x = (ctypes.c_int32 * 3)(1, rank, -rank)
    check(c.migctl_allreduce(x, x, 3, L.INT32, L.SUM, L.HOST, 0, ctypes.byref(h)) == L.OK, "issue")
    deadline = time.time() + 30
    while c.migctl_test(h.value) == L.PENDING and time.time() < deadline:
        time.sleep(0.001)
    check(c.migctl_test(h.value) == L.OK, "test after completion")
    check(c.migctl_wait(h.value, -1) == L.OK, "wait after test")
    check(c.migctl_wait(h.value, -1) == L.ERR_BAD_HANDLE, "second wait of a handle")
    tot = size * (size - 1) // 2
    check(list(x) == [size, tot, -tot], f"allreduce int32 sum: {list(x)}")
    # reduce_scatter in place (uint8), all_gather, broadcast with NULL send off root
    rs = (ctypes.c_uint8 * (2 * size))(*[k + rank for k in range(2 * size)])
    wait(c.migctl_reduce_scatter(rs, rs, 2, L.UINT8, L.SUM, L.HOST, 0, ctypes.byref(h)), "reduce_scatter")
    want = [size * (2 * rank + j) + tot for j in range(2)]
    check(list(rs)[2 * rank:2 * rank + 2] == want, f"reduce_scatter: {list(rs)} want {want} at {2 * rank}")
    g_in = (ctypes.c_int64 * 2)(rank, -rank)
    g_out = (ctypes.c_int64 * (2 * size))()
    wait(c.migctl_all_gather(g_in, g_out, 2, L.INT64, L.HOST, 0, ctypes.byref(h)), "all_gather")
    check(list(g_out) == [v for r in range(size) for v in (r, -r)], f"all_gather: {list(g_out)}")
    bc = (ctypes.c_float * 4)(*([7.5] * 4 if rank == size - 1 else [0] * 4))
    wait(c.migctl_broadcast(bc if rank == size - 1 else None, bc, 4, L.FLOAT32, size - 1, L.HOST, 0,
                            ctypes.byref(h)), "broadcast")
    check(list(bc) == [7.5] * 4, f"broadcast: {list(bc)}")
    # errors: codes and text
    check(c.migctl_allreduce(a, b, n, 9, L.SUM, L.HOST, 0, ctypes.byref(h)) == L.ERR_INVALID and "dtype" in err(),
          f"bad dtype: {err()}")
    check(h.value == 0, "a failed call returns no handle")
    check(c.migctl_allreduce(a, b, n, L.FLOAT64, 7, L.HOST, 0, ctypes.byref(h)) == L.ERR_INVALID and "op" in err(),
          "bad op")
    check(c.migctl_broadcast(bc, bc, 4, L.FLOAT32, size, L.HOST, 0, ctypes.byref(h)) == L.ERR_INVALID, "bad root")
    check(c.migctl_allreduce(a, b, n, L.FLOAT64, L.SUM, L.DEVICE, 0, ctypes.byref(h)) == L.OK, "issue device")
    check(c.migctl_wait(h.value, -1) == L.ERR_UNSUPPORTED and "gpu backend" in err(), f"device on host: {err()}")
    check(c.migctl_wait(987654, -1) == L.ERR_BAD_HANDLE, "unknown handle")
    # a device that is neither MIGCTL_HOST nor MIGCTL_DEVICE fails the issue
    h.value = 0
    check(c.migctl_allreduce(a, b, n, L.FLOAT64, L.SUM, 7, 0, ctypes.byref(h)) == L.ERR_INVALID and "device" in err()
          and h.value == 0, f"device 7: {err()}")
    check(c.migctl_run(L.KIND_ALLREDUCE, a, b, n, L.FLOAT64, L.SUM, 0, -1, 0) == L.ERR_INVALID and "device" in err(),
          f"run on device -1: {err()}")
    # a count whose bytes overflow (all-gather and reduce-scatter: size blocks of it) fails the issue, not
    # the process
    huge = (2**63 - 1) // 8
    check(c.migctl_all_gather(g_in, g_out, huge, L.FLOAT64, L.HOST, 0, ctypes.byref(h)) == L.ERR_INVALID
          and "count" in err(), f"all_gather of a huge count: {err()}")
    check(c.migctl_run(L.KIND_REDUCE_SCATTER, rs, rs, huge, L.FLOAT64, L.SUM, 0, L.HOST, 0) == L.ERR_INVALID
          and "count" in err(), f"run reduce_scatter of a huge count: {err()}")
    # one the executor cannot schedule (it touches no memory) fails its wait with MIGCTL_ERR_UNSUPPORTED
    check(c.migctl_allreduce(a, b, huge, L.FLOAT64, L.SUM, L.HOST, 0, ctypes.byref(h)) == L.OK, f"huge: {err()}")
    code = c.migctl_wait(h.value, -1)
    check(code == L.ERR_UNSUPPORTED and "chunks" in err(), f"allreduce of a huge count: {code} {err()}")
    # migctl_run: issue and wait in one call, with the codes of either
    runs0, direct0 = lib.stats()["runs"], lib.stats()["direct"]
    v = (ctypes.c_double * 4)(*[rank + k for k in range(4)])
    out = (ctypes.c_double * 4)()
    check(c.migctl_run(L.KIND_ALLREDUCE, v, out, 4, L.FLOAT64, L.SUM, 0, L.HOST, 0) == L.OK, f"run: {err()}")
    check(list(out) == [tot + size * k for k in range(4)], f"run allreduce sum: {list(out)}")
    check(c.migctl_run(L.KIND_ALLREDUCE, v, v, 4, L.FLOAT64, L.MIN, 0, L.HOST, 0) == L.OK, f"run in place: {err()}")
    check(list(v) == [float(k) for k in range(4)], f"run allreduce min in place: {list(v)}")
    v[0] = 100.0 + rank
    check(c.migctl_run(L.KIND_BROADCAST, v if rank == size - 1 else None, out, 4, L.FLOAT64, 0, size - 1, L.HOST, 0)
          == L.OK and list(out) == [99.0 + size, 1.0, 2.0, 3.0], f"run broadcast from root {size - 1}: {list(out)}")
    check(c.migctl_run(L.KIND_BARRIER, None, None, 0, 0, 0, 0, 0, 0) == L.OK, f"run barrier: {err()}")
    check(c.migctl_run(L.KIND_ALLREDUCE, v, v, 4, 42, L.SUM, 0, L.HOST, 0) == L.ERR_INVALID and "dtype" in err(),
          f"run with a bad dtype: {err()}")
    check(c.migctl_run(L.KIND_ALLREDUCE, v, v, 4, L.FLOAT64, L.SUM, 0, L.DEVICE, 0) == L.ERR_UNSUPPORTED
          and "gpu backend" in err(), f"run on device memory on the host backend: {err()}")
    check(lib.stats()["runs"] - runs0 == 5, f"runs counted: {lib.stats()['runs'] - runs0}, want 5")
    # with nothing in flight a small one runs on this thread (MIGCTL_LIB_DIRECT_MAX > 0) or
    # through the dispatcher (0); a bad dtype is refused before either
    direct = lib.stats()["direct"] - direct0
    forced = os.environ.get("MIGCTL_LIB_DIRECT_MAX")
    if forced is not None:
        want = 5 if int(forced) > 0 else 0
        check(direct == want, f"runs on the calling thread: {direct}, want {want} (MIGCTL_LIB_DIRECT_MAX={forced})")
    # ... in order behind the collectives in flight: rank 0 comes late, so the
    # others' broadcast is still queued when they call migctl_run; the sum
    # must follow it (size x root's 1), not overtake it
    x = (ctypes.c_int32 * 3)(*[rank + 1] * 3)
    if rank == 0:
        time.sleep(0.3)
    hb = c.migctl_issue(L.KIND_BROADCAST, x, x, 3, L.INT32, 0, 0, L.HOST, 0)
    check(hb > 0, f"issue broadcast: {err()}")
    pending = c.migctl_test(hb) == L.PENDING
    check(rank == 0 or pending, "the broadcast finished without its root")
    check(c.migctl_run(L.KIND_ALLREDUCE, x, x, 3, L.INT32, L.SUM, 0, L.HOST, 0) == L.OK, f"run after issue: {err()}")
    check(c.migctl_test(hb) == L.OK and c.migctl_wait(hb, -1) == L.OK, "broadcast done before the run returned")
    check(list(x) == [size] * 3, f"run after a queued broadcast: {list(x)}, want {[size] * 3}")
    # point-to-point (ABI 10): bad arguments refused at the issue, a transfer
    # to itself at the wait; a ring where every rank sends (issue) before it
    # receives (run: through the dispatcher, never on the calling thread)
    check(c.migctl_issue(L.KIND_RECV + 1, None, None, 0, 0, 0, 0, 0, 0) == L.ERR_INVALID and "kind" in err(),
          f"an unknown kind: {err()}")
    p = (ctypes.c_int64 * 5)(*[rank * 10 + k for k in range(5)])
    q = (ctypes.c_int64 * 5)()
    check(c.migctl_issue(L.KIND_SEND, p, None, 5, L.INT64, 0, size, L.HOST, 0) == L.ERR_INVALID and "peer" in err(),
          f"send to a peer out of range: {err()}")
    check(c.migctl_issue(L.KIND_RECV, p, None, 5, L.INT64, 0, 0, L.HOST, 0) == L.ERR_INVALID and "NULL" in err(),
          f"receive into NULL: {err()}")
    check(c.migctl_run(L.KIND_SEND, p, None, 5, L.INT64, 0, rank, L.HOST, 0) == L.ERR_INVALID and "itself" in err(),
          f"send to itself: {err()}")
    direct1 = lib.stats()["direct"]
    hs = c.migctl_issue(L.KIND_SEND, p, None, 5, L.INT64, 0, (rank + 1) % size, L.HOST, 0)
    check(hs > 0, f"issue send: {err()}")
    check(c.migctl_run(L.KIND_RECV, None, q, 5, L.INT64, 0, (rank - 1) % size, L.HOST, 0) == L.OK,
          f"run receive: {err()}")
    check(c.migctl_wait(hs, -1) == L.OK, f"wait send: {err()}")
    prev = (rank - 1) % size
    check(list(q) == [prev * 10 + k for k in range(5)], f"received {list(q)} from rank {prev}")
    check(lib.stats()["direct"] == direct1, "a transfer ran on the calling thread")
    # groups of some of the ranks: the first and the last, listed last first
    ends = [size - 1, 0]
    arr = (ctypes.c_int * 2)(*ends)
    check(c.migctl_new_group(None, 2, b"x") == L.ERR_INVALID, "new_group without ranks")
    check(c.migctl_new_group(arr, 2, None) == L.ERR_INVALID, "new_group without a name")
    check(c.migctl_new_group((ctypes.c_int * 1)(size), 1, b"x") == L.ERR_INVALID and "not in this group" in err(),
          f"new_group of a rank out of range: {err()}")
    check(c.migctl_group_rank(5) == -1 and c.migctl_group_size(0) == size, "group rank/size of unknown and 0")
    check(c.migctl_issue_on(7, L.KIND_BARRIER, None, None, 0, 0, 0, 0, 0, 0) == L.ERR_CLOSED, "issue on no group")
    check(c.migctl_issue_on(-1, L.KIND_BARRIER, None, None, 0, 0, 0, 0, 0, 0) == L.ERR_INVALID, "issue on group -1")
    if rank in ends:
        gid = c.migctl_new_group(arr, 2, b"ends")
        check(gid > 0, f"new_group: {gid} {err()}")
        check(c.migctl_group_rank(gid) == ends.index(rank) and c.migctl_group_size(gid) == 2,
              f"group rank {c.migctl_group_rank(gid)} size {c.migctl_group_size(gid)}")
        check(c.migctl_set_timeout_on(gid, 60000) == L.OK, f"set_timeout_on: {err()}")
        y = (ctypes.c_int64 * 2)(rank, 1)
        hh = c.migctl_issue_on(gid, L.KIND_ALLREDUCE, y, y, 2, L.INT64, L.SUM, 0, L.HOST, 0)
        check(hh > 0 and c.migctl_wait(hh, -1) == L.OK, f"issue_on allreduce: {err()}")
        check(list(y) == [size - 1, 2], f"group allreduce: {list(y)}, want {[size - 1, 2]}")
        z = (ctypes.c_float * 3)(*([float(rank)] * 3))
        check(c.migctl_run_on(gid, L.KIND_BROADCAST, z, z, 3, L.FLOAT32, 0, 1, L.HOST, 0) == L.OK, f"run_on: {err()}")
        check(list(z) == [0.0] * 3, f"group broadcast from its rank 1 (rank 0): {list(z)}")
        check(c.migctl_run_on(gid, L.KIND_BROADCAST, z, z, 3, L.FLOAT32, 0, 2, L.HOST, 0) == L.ERR_INVALID,
              "group broadcast root out of the group's range")
        check(c.migctl_free_group(gid) == L.OK, f"free_group: {err()}")
        check(c.migctl_issue_on(gid, L.KIND_BARRIER, None, None, 0, 0, 0, 0, 0, 0) == L.ERR_CLOSED and
              "freed" in err(), f"issue on a freed group: {err()}")
        check(c.migctl_free_group(gid) == L.ERR_INVALID, "second free_group")
        again = c.migctl_new_group(arr, 2, b"ends")
        check(again == L.ERR_INVALID and "before" in err(), f"a name used again: {again} {err()}")
        kept = c.migctl_new_group(arr, 2, b"kept")  # left for finalize to free
        check(kept == gid + 1, f"second group id {kept}, want {gid + 1}")
        hk = c.migctl_issue_on(kept, L.KIND_BARRIER, None, None, 0, 0, 0, 0, 0, 0)
        check(hk > 0 and c.migctl_wait(hk, -1) == L.OK, f"barrier on the kept group: {err()}")
    else:
        check(c.migctl_new_group(arr, 2, b"ends") == L.ERR_INVALID and "not one of them" in err(),
              f"new_group by a rank outside it: {err()}")
    # the counters: every collective so far finished and was waited for; host memory needs no stream marks
    st = lib.stats()
    check(set(st) == set(L.STATS), f"stats keys {sorted(st)}")
    check(st["done"] >= 6 and st["waits"] == st["done"], f"stats done/waits: {st}")
    check(st["run_ns"] > 0 and st["queue_ns"] >= 0 and st["marks"] == 0 and st["idle_marks"] == 0, f"stats: {st}")
    check(c.migctl_stats(None, 0) == len(L.STATS), "stats count")
    check(c.migctl_stats(None, 3) == L.ERR_INVALID, "stats into NULL")
    # a forked child is refused without entering the Go runtime
    pid = os.fork()
    if pid == 0:
        ok = c.migctl_rank() == -1 and b"forked" in c.migctl_last_error() and \
            c.migctl_barrier(ctypes.byref(h)) == L.ERR_FORKED
        # the per-collective calls (fork flag only) as well
        ok = ok and c.migctl_issue(L.KIND_BARRIER, None, None, 0, 0, 0, 0, 0, 0) == L.ERR_FORKED and \
            b"forked" in c.migctl_last_error() and \
            c.migctl_run(L.KIND_BARRIER, None, None, 0, 0, 0, 0, 0, 0) == L.ERR_FORKED and \
            c.migctl_wait(1, -1) == L.ERR_FORKED and c.migctl_test(1) == L.ERR_FORKED and \
            c.migctl_stats(None, 0) == L.ERR_FORKED
        os._exit(0 if ok else 1)
    _, st = os.waitpid(pid, 0)
    check(os.waitstatus_to_exitcode(st) == 0, "forked child was not refused")
    # the library leaves SIGINT to Python (no signal.Notify in it)
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.5)
        check(False, "SIGINT did not raise KeyboardInterrupt")
    except KeyboardInterrupt:
        pass
    wait(c.migctl_barrier(ctypes.byref(h)), "barrier")
    check(c.migctl_finalize() == L.OK, f"finalize: {err()}")
    check(c.migctl_barrier(ctypes.byref(h)) == L.ERR_CLOSED, "barrier after finalize")
    check(c.migctl_run(L.KIND_BARRIER, None, None, 0, 0, 0, 0, 0, 0) == L.ERR_CLOSED, "run after finalize")
    check(c.migctl_finalize() == L.OK, "second finalize")
    check(c.migctl_init_from_env() == L.ERR_CLOSED and "finalize" in err(), f"init after finalize: {err()}")
    print(json.dumps({"rank": rank, "size": size, "lib": lib.path, "direct": direct, "failures": failures}), flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
