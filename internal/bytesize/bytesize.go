package bytesize

import (
	"errors"
	"fmt"
	"math/big"
	"strings"
)

// Units states the rule for a flag's help text, e.g.
// "chunk size (" + bytesize.Units + ")".
const Units = "bytes, or KiB/MiB/GiB/TiB (also Ki, Mi, Gi, Ti) = powers of 1024, KB/MB/GB/TB (also K, M, G, T) = powers of 1000"

// ErrInvalid is wrapped by every error Parse returns.
var ErrInvalid = errors.New("invalid byte size")

// multipliers by upper-cased unit.
var multipliers = func() map[string]*big.Int {
	m := map[string]*big.Int{"": big.NewInt(1), "B": big.NewInt(1)}
	for i, p := range []string{"K", "M", "G", "T", "P", "E"} {
		si := new(big.Int).Exp(big.NewInt(1000), big.NewInt(int64(i+1)), nil)
		iec := new(big.Int).Lsh(big.NewInt(1), uint(10*(i+1)))
		m[p], m[p+"B"] = si, si
		m[p+"I"], m[p+"IB"] = iec, iec
	}
	return m
}()

var maxInt64 = big.NewInt(1<<63 - 1)

// Parse reads a byte size by the package's rule: "4096", "64KiB", "4Mi",
// "80GB", "1.5 TiB". It returns the number of bytes, or an error wrapping
// ErrInvalid that quotes s and restates the rule.
func Parse(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := 0
	for i < len(t) && (t[i] >= '0' && t[i] <= '9' || t[i] == '.') {
		i++
	}
	num, unit := t[:i], strings.ToUpper(strings.TrimSpace(t[i:]))
	if !wellFormed(num) {
		return 0, invalid(s, "want a non-negative number with an optional unit")
	}
	mult, ok := multipliers[unit]
	if !ok {
		return 0, invalid(s, fmt.Sprintf("unknown unit %q", strings.TrimSpace(t[i:])))
	}
	r, ok := new(big.Rat).SetString(num)
	if !ok {
		return 0, invalid(s, "want a non-negative number with an optional unit")
	}
	r.Mul(r, new(big.Rat).SetInt(mult))
	if !r.IsInt() {
		return 0, invalid(s, "not a whole number of bytes")
	}
	if r.Num().Cmp(maxInt64) > 0 {
		return 0, invalid(s, "too large (at most 8EiB - 1 bytes)")
	}
	return r.Num().Int64(), nil
}

// wellFormed: digits, optionally a point and more digits ("1", "1.5"; not
// "", ".5", "1.", "1.2.3").
func wellFormed(num string) bool {
	whole, frac, hasPoint := strings.Cut(num, ".")
	return digits(whole) && (!hasPoint || digits(frac))
}

func digits(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

func invalid(s, why string) error {
	return fmt.Errorf("%w %q: %s (sizes are %s)", ErrInvalid, s, why, Units)
}
