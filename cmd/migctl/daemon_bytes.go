package main

import (
	"fmt"
	"strconv"
	"strings"
)

// parseByteSize reads a size such as 1024, 512MiB, 80GiB, 80GB or 1.5T:
// binary units (KiB, MiB, GiB, TiB and K, M, G, T) and decimal ones (KB, MB,
// GB, TB), case-insensitive.
func parseByteSize(s string) (int64, error) {
	t := strings.ToUpper(strings.TrimSpace(s))
	units := []struct {
		suffix string
		mult   float64
	}{ // longest suffixes first
		{"KIB", 1 << 10}, {"MIB", 1 << 20}, {"GIB", 1 << 30}, {"TIB", 1 << 40},
		{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
		{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"T", 1 << 40}, {"B", 1},
	}
	mult := 1.0
	for _, u := range units {
		if strings.HasSuffix(t, u.suffix) {
			mult = u.mult
			t = strings.TrimSpace(strings.TrimSuffix(t, u.suffix))
			break
		}
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || f < 0 {
		return 0, fmt.Errorf("invalid size %q (want e.g. 1024, 512MiB, 80GiB)", s)
	}
	return int64(f * mult), nil
}
