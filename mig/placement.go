package mig

import (
	"fmt"
	"strconv"
	"strings"
)

// MemoryUnits is the size of the memory axis of every MIG GPU migctl knows
// (A100, H100, H200): placements are [Start, Start+Size) within it.
const MemoryUnits = 8

// Placement is where a GPU instance sits on the memory axis.
type Placement struct {
	Start int `json:"start" yaml:"start"`
	Size  int `json:"size" yaml:"size"`
}

// End is one past the last memory unit used.
func (p Placement) End() int { return p.Start + p.Size }

// Overlaps reports whether p and q share a memory unit.
func (p Placement) Overlaps(q Placement) bool { return p.Start < q.End() && q.Start < p.End() }

// Mask is the set of memory units p occupies, bit i for unit i.
func (p Placement) Mask() uint16 { return uint16((1<<p.Size)-1) << p.Start }

// String prints "start:size", the notation of nvidia-smi's placement lists.
func (p Placement) String() string { return fmt.Sprintf("%d:%d", p.Start, p.Size) }

// ParsePlacement parses "start:size" or a bare "start" (size 0, to be
// filled from the profile).
func ParsePlacement(s string) (Placement, error) {
	a, b, hasSize := strings.Cut(strings.TrimSpace(s), ":")
	start, err := strconv.Atoi(a)
	if err != nil || start < 0 || start >= MemoryUnits {
		return Placement{}, fmt.Errorf("placement %q: start must be 0..%d", s, MemoryUnits-1)
	}
	p := Placement{Start: start}
	if hasSize {
		size, err := strconv.Atoi(b)
		if err != nil || size < 1 || start+size > MemoryUnits {
			return Placement{}, fmt.Errorf("placement %q: bad size", s)
		}
		p.Size = size
	}
	return p, nil
}

// freeUnits lists the unset bits of mask among the memory units.
func freeUnits(mask uint16) []int {
	var out []int
	for i := 0; i < MemoryUnits; i++ {
		if mask&(1<<i) == 0 {
			out = append(out, i)
		}
	}
	return out
}

// freeRanges renders the free units of mask as "0-1,5" ("none" when full).
func freeRanges(mask uint16) string {
	var parts []string
	for i := 0; i < MemoryUnits; {
		if mask&(1<<i) != 0 {
			i++
			continue
		}
		j := i
		for j+1 < MemoryUnits && mask&(1<<(j+1)) == 0 {
			j++
		}
		if i == j {
			parts = append(parts, strconv.Itoa(i))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", i, j))
		}
		i = j + 1
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ",")
}

// largestFreeRun is the length of the longest run of free units in mask.
func largestFreeRun(mask uint16) int {
	best, cur := 0, 0
	for i := 0; i < MemoryUnits; i++ {
		if mask&(1<<i) == 0 {
			cur++
			if cur > best {
				best = cur
			}
		} else {
			cur = 0
		}
	}
	return best
}

// freeFragments counts the maximal runs of free units in mask.
func freeFragments(mask uint16) int {
	n := 0
	for i := 0; i < MemoryUnits; i++ {
		if mask&(1<<i) == 0 && (i == 0 || mask&(1<<(i-1)) != 0) {
			n++
		}
	}
	return n
}
