package bytesize_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/internal/bytesize"
)

func TestParse(t *testing.T) {
	tests := []struct {
		desc string
		in   string
		want int64
	}{
		{"plain number is bytes", "4096", 4096},
		{"zero", "0", 0},
		{"B alone is bytes", "8B", 8},
		{"surrounding spaces", "  8  ", 8},
		{"K is 1000", "8K", 8000},
		{"KB is 1000", "8KB", 8000},
		{"KiB is 1024", "8KiB", 8 << 10},
		{"Ki is 1024", "8Ki", 8 << 10},
		{"M is 10^6", "16M", 16_000_000},
		{"MB is 10^6", "16MB", 16_000_000},
		{"MiB is 2^20", "16MiB", 16 << 20},
		{"Mi is 2^20", "16Mi", 16 << 20},
		{"G is 10^9", "80G", 80_000_000_000},
		{"GB is 10^9", "80GB", 80_000_000_000},
		{"GiB is 2^30", "80GiB", 80 << 30},
		{"Gi is 2^30", "80Gi", 80 << 30},
		{"T is 10^12", "2T", 2_000_000_000_000},
		{"TB is 10^12", "2TB", 2_000_000_000_000},
		{"TiB is 2^40", "2TiB", 2 << 40},
		{"Ti is 2^40", "2Ti", 2 << 40},
		{"PiB", "1PiB", 1 << 50},
		{"EB", "9EB", 9_000_000_000_000_000_000},
		{"lower case", "64kib", 64 << 10},
		{"lower case SI", "64kb", 64_000},
		{"upper case I", "64KIB", 64 << 10},
		{"space before the unit", "80 GiB", 80 << 30},
		{"fraction of an IEC unit", "1.5KiB", 1536},
		{"fraction of an SI unit", "0.5K", 500},
		{"fraction that is whole bytes", "2.0", 2},
		{"largest", "9223372036854775807", math.MaxInt64},
		{"largest with a unit", "7EiB", 7 << 60},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			got, err := bytesize.Parse(tc.in)
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestParseRejects(t *testing.T) {
	tests := []struct {
		desc string
		in   string
		why  string // substring of the error
	}{
		{"empty", "", "want a non-negative number"},
		{"spaces only", "   ", "want a non-negative number"},
		{"negative", "-1", "want a non-negative number"},
		{"negative with unit", "-8KiB", "want a non-negative number"},
		{"plus sign", "+8", "want a non-negative number"},
		{"unit only", "GiB", "want a non-negative number"},
		{"garbage", "lots", "want a non-negative number"},
		{"unknown unit", "12X", `unknown unit "X"`},
		{"bits are not a unit", "8Kb/s", "unknown unit"},
		{"two units", "1GiB2", "unknown unit"},
		{"exponent", "1e9", `unknown unit "e9"`},
		{"hex", "0x10", "unknown unit"},
		{"underscore", "1_000", "unknown unit"},
		{"lone point", ".5", "want a non-negative number"},
		{"trailing point", "5.", "want a non-negative number"},
		{"two points", "1.2.3", "want a non-negative number"},
		{"fraction of a byte", "0.1", "not a whole number of bytes"},
		{"fraction of a byte with unit", "1.0001K", "not a whole number of bytes"},
		{"overflow", "9223372036854775808", "too large"},
		{"overflow with unit", "8EiB", "too large"},
		{"overflow far", "99999999999999999999999TiB", "too large"},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			got, err := bytesize.Parse(tc.in)
			require.ErrorIs(t, err, bytesize.ErrInvalid)
			require.ErrorContains(t, err, tc.why)
			require.ErrorContains(t, err, "powers of 1024", "the error restates the rule")
			require.Zero(t, got)
		})
	}
}
