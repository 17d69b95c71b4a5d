// Package bytesize parses the byte sizes every migctl flag takes (bench
// message sizes and chunks, the daemon's memory and headroom, swap
// reservations, simulated process memory): one rule, one function.
//
// The rule, stated in every --help that takes a size (see [Units]):
//
//   - a plain number is bytes: 4096
//   - IEC units are powers of 1024: KiB, MiB, GiB, TiB, PiB, EiB, also
//     written Ki, Mi, Gi, Ti, Pi, Ei: 80GiB = 80·2^30
//   - SI units are powers of 1000: KB, MB, GB, TB, PB, EB, also written K,
//     M, G, T, P, E: 80GB = 80G = 80·10^9
//
// Units are case-insensitive and may follow the number after spaces; a
// trailing B alone means bytes. A fraction is allowed when the result is a
// whole number of bytes (1.5KiB = 1536, 0.5K = 500; 0.1 is refused).
// Negative numbers, values over math.MaxInt64, exponents, unknown units and
// anything else are refused with an error wrapping [ErrInvalid].
//
// Parse is a pure function, safe for concurrent use.
package bytesize
