/*
 * migswap.h — the ABI of libmigswap.so beyond the CUDA driver symbols it
 * interposes. A program does not need this header to be swapped: it is for
 * tests and tools that want to look at the shim from inside the process
 * (resolve the symbols with dlsym(RTLD_DEFAULT, ...): they exist only when the
 * shim is preloaded).
 */
#ifndef MIGSWAP_H
#define MIGSWAP_H

#include <stdint.h>

#define MIGSWAP_ABI_VERSION 2 /* 2: the prio_* fields appended */

/* How the shim runs in this process. */
enum migswap_mode {
	MIGSWAP_MODE_UNDECIDED = 0,   /* no CUDA call seen yet */
	MIGSWAP_MODE_PASSTHROUGH = 1, /* no daemon: every call goes straight to the driver */
	MIGSWAP_MODE_VMM = 2,         /* registered with the daemon: allocations are VMM-backed */
};

/* Where the process's GPU memory is. */
enum migswap_state {
	MIGSWAP_STATE_RESIDENT = 0,
	MIGSWAP_STATE_SWAPPING_OUT = 1,
	MIGSWAP_STATE_SWAPPED_OUT = 2,
	MIGSWAP_STATE_SWAPPING_IN = 3,
	MIGSWAP_STATE_CORRUPT = 4, /* a checksum failed on swap-in: the process stays blocked for good */
};

struct migswap_stats {
	uint32_t abi_version; /* MIGSWAP_ABI_VERSION */
	uint32_t mode;        /* enum migswap_mode */
	uint32_t state;       /* enum migswap_state */
	uint32_t connected;   /* 1 while the control connection to the daemon is up */
	uint64_t allocations; /* live VMM-backed allocations */
	uint64_t bytes;       /* bytes those allocations hold on the device (granularity-rounded) */
	uint64_t gated_calls; /* intercepted launches/copies/memsets that passed the gate */
	uint64_t swaps_out;   /* completed swap-outs */
	uint64_t swaps_in;    /* completed swap-ins */
	uint64_t bytes_out;   /* bytes copied to host by swap-outs */
	uint64_t bytes_in;    /* bytes copied back by swap-ins */
	uint64_t refusals;    /* swap requests refused or failed */
	uint64_t needs;       /* `need` messages sent after OUT_OF_MEMORY */
	uint64_t arena_bytes; /* size of the pinned host arena (0 until the first swap-out,
	                       * or until MIGSWAP_PREPIN=1 grows it in the background) */
	/* priority launch gating (ABI 2) */
	uint64_t prio_holds;        /* launches/copies held because a higher-priority process was busy */
	uint64_t prio_held_ns;      /* total time they waited */
	uint64_t prio_busy_periods; /* times this process went from idle to work in flight (signalling only) */
	uint64_t prio_busy_ns;      /* total time it had work in flight */
	uint64_t prio_mask;         /* slots of the higher-priority processes it yields to now */
	uint32_t prio_policy;       /* 0 off, 1 gate, 2 budget */
	uint32_t prio_budget;       /* launches in flight allowed while held (budget) */
	int32_t prio_slot;          /* this process's slot on the device's page, -1 none */
	uint32_t prio_signal;       /* 1 while it publishes its work in flight */
	uint32_t prio_depth;        /* launches in flight allowed while not held (0: no limit) */
	uint32_t prio_reserved;
};

/* migswap_get_stats fills *out; safe from any thread; returns 0. */
int migswap_get_stats(struct migswap_stats *out);

/* migswap_unswappable_reason returns why a swap-out would be refused now, or
 * NULL when nothing prevents it. The string is static. */
const char *migswap_unswappable_reason(void);

#endif
