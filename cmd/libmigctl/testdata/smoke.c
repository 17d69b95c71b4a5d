/* A C program on include/migctl.h: a group of one (no launcher), every
 * collective on host memory, an error code with its text. Prints "ok". */
#include <stdio.h>
#include <string.h>

#include "migctl.h"

#define CHECK(cond, what)                                                        \
	do {                                                                         \
		if (!(cond)) {                                                           \
			fprintf(stderr, "%s failed: %s\n", what, migctl_last_error());       \
			return 1;                                                            \
		}                                                                        \
	} while (0)

int main(void) {
	migctl_work_t w = 0;
	float x[3] = {1.5f, -2.0f, 4.0f}, y[3] = {0};
	CHECK(migctl_abi_version() == MIGCTL_ABI_VERSION, "abi version");
	CHECK(migctl_init_from_env() == MIGCTL_OK, "init");
	CHECK(migctl_rank() == 0 && migctl_size() == 1, "rank/size");
	CHECK(migctl_allreduce(x, y, 3, MIGCTL_FLOAT32, MIGCTL_SUM, MIGCTL_HOST, 0, &w) == MIGCTL_OK, "allreduce");
	CHECK(migctl_wait(w, -1) == MIGCTL_OK, "wait");
	CHECK(memcmp(x, y, sizeof x) == 0, "allreduce result");
	CHECK(migctl_all_gather(x, y, 3, MIGCTL_FLOAT32, MIGCTL_HOST, 0, &w) == MIGCTL_OK, "all_gather");
	CHECK(migctl_wait(w, 1000) == MIGCTL_OK, "wait");
	CHECK(migctl_broadcast(x, x, 3, MIGCTL_FLOAT32, 0, MIGCTL_HOST, 0, &w) == MIGCTL_OK, "broadcast");
	CHECK(migctl_wait(w, -1) == MIGCTL_OK, "wait");
	CHECK(migctl_reduce_scatter(x, y, 3, MIGCTL_FLOAT32, MIGCTL_MAX, MIGCTL_HOST, 0, &w) == MIGCTL_OK, "reduce_scatter");
	CHECK(migctl_wait(w, -1) == MIGCTL_OK, "wait");
	CHECK(migctl_barrier(&w) == MIGCTL_OK && migctl_wait(w, -1) == MIGCTL_OK, "barrier");
	{
		int64_t h = migctl_issue(MIGCTL_KIND_ALLREDUCE, x, y, 3, MIGCTL_FLOAT32, MIGCTL_MAX, 0, MIGCTL_HOST, 0);
		CHECK(h > 0 && migctl_wait((migctl_work_t)h, -1) == MIGCTL_OK, "migctl_issue allreduce");
		h = migctl_issue(MIGCTL_KIND_BARRIER, NULL, NULL, 0, 0, 0, 0, 0, 0);
		CHECK(h > 0 && migctl_wait((migctl_work_t)h, -1) == MIGCTL_OK, "migctl_issue barrier");
		CHECK(migctl_issue(99, x, y, 3, MIGCTL_FLOAT32, 0, 0, MIGCTL_HOST, 0) == MIGCTL_ERR_INVALID, "bad kind refused");
		CHECK(migctl_issue(MIGCTL_KIND_ALLREDUCE, x, y, 3, 42, 0, 0, MIGCTL_HOST, 0) == MIGCTL_ERR_INVALID, "issue: bad dtype");
	}
	CHECK(migctl_allreduce(x, y, 3, 42, MIGCTL_SUM, MIGCTL_HOST, 0, &w) == MIGCTL_ERR_INVALID, "bad dtype refused");
	CHECK(strstr(migctl_last_error(), "dtype") != NULL, "error text names the dtype");
	CHECK(migctl_finalize() == MIGCTL_OK, "finalize");
	puts("ok");
	return 0;
}
