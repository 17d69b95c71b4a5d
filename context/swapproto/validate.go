package swapproto

import (
	"errors"
	"fmt"
	"math"
	"unicode"
	"unicode/utf8"
)

// Limits on the fields of messages from a shim (PROTOCOL.md, "Limits").
// Validate enforces them; the daemon adds what needs its state (the device's
// memory, the peer's pid).
const (
	// MaxBytes bounds every byte count (bytes, done, total) whatever the
	// device: 16 TiB, far above any GPU's memory.
	MaxBytes = int64(1) << 44
	// MaxPID is the kernel's PID_MAX_LIMIT (2^22).
	MaxPID = 1 << 22
	// MaxPriority bounds the priority in both directions.
	MaxPriority = 1_000_000
	// MaxJob is the longest job name in bytes (the shim truncates at 255).
	MaxJob = 256
	// MaxDevice is the longest device name in bytes ("MIG-GPU-<uuid>/7/0" fits).
	MaxDevice = 96
	// MaxID is the longest id token in bytes.
	MaxID = 64
	// MaxText is the longest error or reason string in bytes.
	MaxText = 1024
	// MaxSeconds bounds a result's seconds (one day).
	MaxSeconds = 86400
	// MaxGateSeconds bounds gate_stats' cumulative seconds (ten years).
	MaxGateSeconds = 10 * 365 * 86400
)

// ErrInvalid: a message decoded but a field is out of its limits. The daemon
// disconnects a shim that sends one.
var ErrInvalid = errors.New("swapproto: invalid message")

// Validate checks the fields a shim → daemon message of type m.Type carries
// against the limits above (the first violation is reported): byte counts non-negative and at most MaxBytes,
// pid in [0, MaxPID], priority within ±MaxPriority, job, device and strings
// bounded, valid UTF-8 and free of control characters, ids present where the
// type needs one. Fields a type does not use are ignored, as are unknown and
// daemon → shim types (the caller answers those). It returns a wrapped
// ErrInvalid naming the field.
func (m Message) Validate() error {
	var first error // the first violation found is the one reported
	bad := func(format string, a ...any) {
		if first == nil {
			first = fmt.Errorf("%w: %s: %s", ErrInvalid, m.Type, fmt.Sprintf(format, a...))
		}
	}
	bytesField := func(name string, v int64) {
		switch {
		case v < 0:
			bad("%s %d is negative", name, v)
		case v > MaxBytes:
			bad("%s %d is over the %d-byte limit", name, v, MaxBytes)
		}
	}
	id := func(required bool) {
		switch {
		case m.ID == "" && required:
			bad("missing id")
		case len(m.ID) > MaxID:
			bad("id is %d bytes, over %d", len(m.ID), MaxID)
		}
	}
	switch m.Type {
	case TypeHello:
		if m.Version != Version {
			bad("unsupported protocol version %d (this daemon speaks %d)", m.Version, Version)
		}
		if m.PID < 0 || m.PID > MaxPID {
			bad("pid %d is out of range [0, %d]", m.PID, MaxPID)
		}
		if m.Priority < -MaxPriority || m.Priority > MaxPriority {
			bad("priority %d is out of range [%d, %d]", m.Priority, -MaxPriority, MaxPriority)
		}
		if err := checkText("job", m.Job, MaxJob); err != nil {
			bad("%v", err)
		}
		if err := checkDevice(string(m.Device)); err != nil {
			bad("%v", err)
		}
		bytesField("bytes", m.Bytes)
	case TypeUsage:
		bytesField("bytes", m.Bytes)
	case TypeNeed:
		id(true)
		bytesField("bytes", m.Bytes)
		if m.Bytes == 0 {
			bad("bytes must be positive")
		}
	case TypeProgress:
		id(true)
		bytesField("done", m.Done)
		bytesField("total", m.Total)
		if m.Done > m.Total {
			bad("done %d exceeds total %d", m.Done, m.Total)
		}
	case TypeResult:
		id(true)
		bytesField("bytes", m.Bytes)
		if m.Seconds < 0 || m.Seconds > MaxSeconds || math.IsNaN(m.Seconds) {
			bad("seconds %g is out of range [0, %d]", m.Seconds, MaxSeconds)
		}
		if err := checkText("error", m.Error, MaxText); err != nil {
			bad("%v", err)
		}
	case TypeGateStats:
		if m.Holds < 0 || m.BusyPeriods < 0 {
			bad("holds %d and busy_periods %d must not be negative", m.Holds, m.BusyPeriods)
		}
		for _, f := range []struct {
			name string
			v    float64
		}{{"held_seconds", m.HeldSeconds}, {"busy_seconds", m.BusySeconds}} {
			if f.v < 0 || f.v > MaxGateSeconds || math.IsNaN(f.v) {
				bad("%s %g is out of range [0, %d]", f.name, f.v, MaxGateSeconds)
			}
		}
	}
	return first
}

// checkText accepts valid UTF-8 of at most max bytes without control characters.
func checkText(field, s string, max int) error {
	switch {
	case len(s) > max:
		return fmt.Errorf("%s is %d bytes, over %d", field, len(s), max)
	case !utf8.ValidString(s):
		return fmt.Errorf("%s is not valid UTF-8", field)
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return fmt.Errorf("%s contains control character %U", field, r)
		}
	}
	return nil
}

// checkDevice accepts "" (the default device), an ordinal or a UUID-like name
// of letters, digits and "-_.:/".
func checkDevice(d string) error {
	if len(d) > MaxDevice {
		return fmt.Errorf("device is %d bytes, over %d", len(d), MaxDevice)
	}
	for _, r := range d {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
		case r == '-', r == '_', r == '.', r == ':', r == '/':
		default:
			return fmt.Errorf("device %q contains %q (allowed: letters, digits, -_.:/)", d, r)
		}
	}
	return nil
}
