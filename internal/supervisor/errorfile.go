package supervisor

import (
	"encoding/json"
	"os"
	"strconv"
)

// maxErrorFile bounds how much of a worker's error file is read.
const maxErrorFile = 1 << 20

// ErrorRecord is what a worker wrote to its error file: torchrun's
// TORCHELASTIC_ERROR_FILE JSON, as torch.distributed.elastic's @record
// writes it ({"message": {"message": "...", "extraInfo": {"py_callstack":
// "...", "timestamp": "..."}}}) or any JSON object with a "message".
type ErrorRecord struct {
	// Message is the error message ("" if the file has none).
	Message string `json:"message" yaml:"message"`
	// Timestamp is when the worker wrote it (Unix seconds; 0 if absent).
	Timestamp int64 `json:"timestamp,omitempty" yaml:"timestamp,omitempty"`
	// Raw is the file as written.
	Raw json.RawMessage `json:"raw" yaml:"-"`
}

// readErrorFile reads path; nil when there is no such file or it is not
// JSON.
func readErrorFile(path string) *ErrorRecord {
	if path == "" {
		return nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	b := make([]byte, maxErrorFile)
	n, _ := f.Read(b)
	b = b[:n]
	if !json.Valid(b) {
		return nil
	}
	rec := &ErrorRecord{Raw: json.RawMessage(b)}
	var top struct {
		Message   json.RawMessage `json:"message"`
		Timestamp json.RawMessage `json:"timestamp"`
	}
	if json.Unmarshal(b, &top) != nil {
		return rec
	}
	var s string
	var inner struct {
		Message   string `json:"message"`
		ExtraInfo struct {
			Timestamp json.RawMessage `json:"timestamp"`
		} `json:"extraInfo"`
	}
	switch {
	case json.Unmarshal(top.Message, &s) == nil:
		rec.Message = s
	case json.Unmarshal(top.Message, &inner) == nil:
		rec.Message = inner.Message
		rec.Timestamp = parseTimestamp(inner.ExtraInfo.Timestamp)
	}
	if rec.Timestamp == 0 {
		rec.Timestamp = parseTimestamp(top.Timestamp)
	}
	return rec
}

// parseTimestamp reads a Unix time given as a JSON number or string.
func parseTimestamp(raw json.RawMessage) int64 {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		n, _ := strconv.ParseInt(s, 10, 64)
		return n
	}
	var n int64
	_ = json.Unmarshal(raw, &n)
	return n
}
