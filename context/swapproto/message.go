package swapproto

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
)

// Version is the protocol version this package speaks.
const Version = 1

// MaxLine is the longest message, in bytes without the trailing newline.
const MaxLine = 4096

// Message types, shim → daemon.
const (
	TypeHello    = "hello"
	TypeUsage    = "usage"
	TypeNeed     = "need"
	TypeProgress = "progress"
	TypeResult   = "result"
	// TypeGateStats reports the shim's priority-gating counters (holds,
	// held_seconds, busy_periods, busy_seconds), at most every 100 ms after a change.
	TypeGateStats = "gate_stats"
)

// Message types, daemon → shim.
const (
	TypeWelcome = "welcome"
	TypeSwapOut = "swap_out"
	TypeSwapIn  = "swap_in"
	TypeGranted = "granted"
	TypeDenied  = "denied"
	TypeError   = "error"
	// TypeGate sets the shim's priority gating (policy, budget, depth, slot,
	// mask, signal, stale_ms, class); with page true the device's shared page
	// comes with the line as an SCM_RIGHTS descriptor.
	TypeGate = "gate"
)

// Sentinel errors returned by Reader.Read and Encode.
var (
	// ErrLineTooLong: a line exceeded MaxLine bytes; it was discarded.
	ErrLineTooLong = errors.New("swapproto: message longer than 4 KiB")
	// ErrMalformed: a line was not a JSON object with a string "type".
	ErrMalformed = errors.New("swapproto: malformed message")
)

// Message is every message of the protocol in one flat shape; each type uses
// the fields PROTOCOL.md lists for it and leaves the others zero.
type Message struct {
	Type     string  `json:"type"`
	Version  int     `json:"version,omitempty"`
	PID      int     `json:"pid,omitempty"`
	Job      string  `json:"job,omitempty"`
	Priority int     `json:"priority,omitempty"`
	Device   Device  `json:"device,omitempty"`
	Bytes    int64   `json:"bytes,omitempty"`
	ID       ID      `json:"id,omitempty"`
	Done     int64   `json:"done,omitempty"`
	Total    int64   `json:"total,omitempty"`
	OK       bool    `json:"ok,omitempty"`
	Seconds  float64 `json:"seconds,omitempty"`
	Error    string  `json:"error,omitempty"`
	Reason   string  `json:"reason,omitempty"`

	// gate (daemon → shim); see PROTOCOL.md "Priority launch gating".
	Policy  string `json:"policy,omitempty"`
	Budget  int    `json:"budget,omitempty"`
	Depth   int    `json:"depth,omitempty"`
	Slot    *int   `json:"slot,omitempty"`
	Mask    uint64 `json:"mask,omitempty"`
	Signal  bool   `json:"signal,omitempty"`
	StaleMS int    `json:"stale_ms,omitempty"`
	Page    bool   `json:"page,omitempty"`
	Class   string `json:"class,omitempty"`

	// gate_stats (shim → daemon): cumulative counters.
	Holds       int64   `json:"holds,omitempty"`
	HeldSeconds float64 `json:"held_seconds,omitempty"`
	BusyPeriods int64   `json:"busy_periods,omitempty"`
	BusySeconds float64 `json:"busy_seconds,omitempty"`
}

// Known reports whether m.Type is a type of protocol version 1.
func (m Message) Known() bool {
	switch m.Type {
	case TypeHello, TypeUsage, TypeNeed, TypeProgress, TypeResult, TypeGateStats,
		TypeWelcome, TypeSwapOut, TypeSwapIn, TypeGranted, TypeDenied, TypeError, TypeGate:
		return true
	}
	return false
}

// ID is an exchange id as the raw JSON scalar its starter sent (a number or a
// string), so that it is echoed back exactly. The zero ID is absent.
type ID string

// IntID returns the ID for an integer the daemon chose.
func IntID(n uint64) ID { return ID(strconv.FormatUint(n, 10)) }

// MarshalJSON writes the raw token.
func (id ID) MarshalJSON() ([]byte, error) {
	if id == "" {
		return []byte("null"), nil
	}
	return []byte(id), nil
}

// UnmarshalJSON keeps a number or string token as is; null means absent.
func (id *ID) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	switch {
	case bytes.Equal(b, []byte("null")):
		*id = ""
	case len(b) > 0 && (b[0] == '"' || b[0] == '-' || (b[0] >= '0' && b[0] <= '9')):
		if !json.Valid(b) {
			return fmt.Errorf("invalid id %s", b)
		}
		*id = ID(b)
	default:
		return fmt.Errorf("id must be a number or a string, got %s", b)
	}
	return nil
}

// Device is a device as the shim names it: a GPU/MIG UUID or a CUDA ordinal,
// kept as text. It decodes from a JSON string or number.
type Device string

// UnmarshalJSON accepts "GPU-…", "MIG-…", "0" or 0.
func (d *Device) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		*d = Device(s)
		return nil
	}
	if bytes.Equal(b, []byte("null")) {
		*d = ""
		return nil
	}
	var n json.Number
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("device must be a string or a number, got %s", b)
	}
	*d = Device(n.String())
	return nil
}

// Encode returns m as one line, newline included.
func Encode(m Message) ([]byte, error) {
	if m.Type == "" {
		return nil, fmt.Errorf("encoding message: %w: empty type", ErrMalformed)
	}
	b, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encoding %s message: %w", m.Type, err)
	}
	if len(b) > MaxLine {
		return nil, fmt.Errorf("encoding %s message: %w", m.Type, ErrLineTooLong)
	}
	return append(b, '\n'), nil
}

// Decode parses one line (without or with its newline).
func Decode(line []byte) (Message, error) {
	line = bytes.TrimRight(line, "\r\n")
	if len(line) > MaxLine {
		return Message{}, ErrLineTooLong
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(line, &raw); err != nil {
		return Message{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	var typ string
	if err := json.Unmarshal(raw["type"], &typ); err != nil || typ == "" {
		return Message{}, fmt.Errorf("%w: missing or non-string \"type\"", ErrMalformed)
	}
	var m Message
	if err := json.Unmarshal(line, &m); err != nil {
		return Message{}, fmt.Errorf("%w: %s: %v", ErrMalformed, typ, err)
	}
	return m, nil
}
