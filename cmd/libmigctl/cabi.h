// The ring of collectives shared by cabi.c (the C entry points) and main.go
// (the dispatcher goroutine). Not part of the public ABI.
#ifndef MIGCTL_CABI_H
#define MIGCTL_CABI_H

#include <stddef.h>
#include <stdint.h>

#define MIGCTL_SLOTS 4096 // collectives issued and not yet waited for, at most

typedef struct {
	uint64_t id;      // the handle in this slot; 0: free; UINT64_MAX: being released
	int group;        // 0: the process's group; else an id of migctl_new_group
	int kind, dtype, op, root, device;
	void *send, *recv;
	size_t count;
	uintptr_t stream;
	uint64_t order;   // device buffers: the mark of the caller's stream taken at the issue (0: none needed)
	int streamed;     // issued by migctl_run: the result may be ordered on the stream rather than waited for
	int64_t t_issue, t_take, t_done; // CLOCK_MONOTONIC ns: issued, taken by the dispatcher, finished
	uint32_t word;    // 0 queued or running, 1 done, 2 running with a waiter asleep on it,
	                  // 3 running, its waiter gone (migctl_wait_stream): finish frees the slot
	uint32_t rword;   // 0 not ready, 1 ready (migctl_ready) or done, 2 not ready with a waiter asleep on it
	int ready;        // migctl_ready was called: the result is queued on the device
	int code;         // the result once done
	char *err;        // its text (malloc'd) when code != MIGCTL_OK
} migctl_slot_t;

void migctl_set_error(const char *msg, size_t n);
migctl_slot_t *migctl_next(void);
void migctl_complete(migctl_slot_t *s, int code, const char *msg, size_t n);
void migctl_hand_off(migctl_slot_t *s);
void migctl_hand_off_chained(migctl_slot_t *s);
void migctl_ready(migctl_slot_t *s);
void migctl_complete_handed(migctl_slot_t *s, int code, const char *msg, size_t n);
void migctl_stop_dispatcher(void);

#endif
