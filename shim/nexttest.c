/*
 * nexttest.c — checks that dlsym(RTLD_NEXT, ...) still means "after the
 * caller" with libmigswap.so preloaded (the shim defines dlsym). Built three
 * ways by the Makefile: -DNEXT_A (a wrapper library whose next_probe calls the
 * next definition), -DNEXT_B (the wrapped library), and the program linked
 * against both, A first. Prints "next_probe=42" when RTLD_NEXT works, and
 * "libcuda_loaded=0" when looking up a non-CUDA "cu" name left the driver alone.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>

#if defined(NEXT_A)
int next_probe(int depth)
{
	if (depth > 3)
		return -1; /* found itself again: RTLD_NEXT is broken */
	int (*next)(int) = (int (*)(int))dlsym(RTLD_NEXT, "next_probe");
	return next ? next(depth + 1) : -2;
}
#elif defined(NEXT_B)
int next_probe(int depth)
{
	(void)depth;
	return 42;
}
#else
int next_probe(int depth);
int main(void)
{
	printf("next_probe=%d\n", next_probe(0));
	/* a libc function whose name starts with "cu": looking it up must not make
	 * the shim load the CUDA driver into a program that never uses CUDA */
	void *f = dlsym(RTLD_DEFAULT, "cuserid");
	void *cuda = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
	printf("cuserid=%d libcuda_loaded=%d\n", f != NULL, cuda != NULL);
	return 0;
}
#endif
