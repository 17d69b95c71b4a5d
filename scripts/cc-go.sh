#!/bin/sh
# cc-go.sh — the C compiler the Makefile gives the go command (CC): runs
# $MIGCTL_REAL_CC (default gcc) unchanged, except for the cgo files of
# go-nvml's pkg/nvml, which get -Wno-deprecated-declarations. go-nvml wraps
# every NVML function, the ones nvml.h marks deprecated included, so a fresh
# build printed pages of warnings about code that is not ours and that no
# one here can act on. Our own cgo packages (internal/cuda, cmd/libmigctl)
# keep every warning: the flag is added by package, not globally as
# CGO_CFLAGS would (go has no per-package CGO_CFLAGS).
#
# cgo compiles each file of a package with "-I <the package's source
# directory>" among its arguments; that directory names the package.
for arg in "$@"; do
	case "$arg" in
	*/go-nvml@*/pkg/nvml | */go-nvml/pkg/nvml)
		exec ${MIGCTL_REAL_CC:-gcc} "$@" -Wno-deprecated-declarations
		;;
	esac
done
exec ${MIGCTL_REAL_CC:-gcc} "$@"
