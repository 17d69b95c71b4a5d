package swapproto

import (
	"bytes"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestDecode(t *testing.T) {
	tests := []struct {
		desc    string
		line    string
		want    Message
		wantErr error
	}{
		{"hello with string device", `{"type":"hello","version":1,"pid":42,"job":"train","priority":-3,"device":"GPU-abc","bytes":1024}`,
			Message{Type: TypeHello, Version: 1, PID: 42, Job: "train", Priority: -3, Device: "GPU-abc", Bytes: 1024}, nil},
		{"hello with numeric device", `{"type":"hello","version":1,"pid":1,"device":0}` + "\n",
			Message{Type: TypeHello, Version: 1, PID: 1, Device: "0"}, nil},
		{"need with numeric id", `{"type":"need","id":7,"bytes":99}`, Message{Type: TypeNeed, ID: "7", Bytes: 99}, nil},
		{"need with string id", `{"type":"need","id":"n-1","bytes":99}`, Message{Type: TypeNeed, ID: `"n-1"`, Bytes: 99}, nil},
		{"result failure", `{"type":"result","id":3,"ok":false,"bytes":5,"seconds":0.5,"error":"ipc memory"}`,
			Message{Type: TypeResult, ID: "3", Bytes: 5, Seconds: 0.5, Error: "ipc memory"}, nil},
		{"unknown fields ignored", `{"type":"usage","bytes":8,"future":{"x":1}}`, Message{Type: TypeUsage, Bytes: 8}, nil},
		{"unknown type decodes", `{"type":"telemetry"}`, Message{Type: "telemetry"}, nil},
		{"not json", `hello`, Message{}, ErrMalformed},
		{"no type", `{"pid":1}`, Message{}, ErrMalformed},
		{"non-string type", `{"type":3}`, Message{}, ErrMalformed},
		{"bad id", `{"type":"need","id":{"a":1}}`, Message{}, ErrMalformed},
		{"too long", `{"type":"usage","job":"` + strings.Repeat("x", MaxLine) + `"}`, Message{}, ErrLineTooLong},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			got, err := Decode([]byte(tc.line))
			if tc.wantErr != nil {
				require.ErrorIs(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestEncodeEchoesIDs(t *testing.T) {
	tests := []struct {
		desc string
		msg  Message
		want string
	}{
		{"daemon integer id", Message{Type: TypeSwapOut, ID: IntID(12)}, `{"type":"swap_out","id":12}` + "\n"},
		{"echo string id", Message{Type: TypeGranted, ID: `"n-1"`}, `{"type":"granted","id":"n-1"}` + "\n"},
		{"denied with reason", Message{Type: TypeDenied, ID: "4", Reason: "no"}, `{"type":"denied","id":4,"reason":"no"}` + "\n"},
		{"welcome", Message{Type: TypeWelcome, Version: Version}, `{"type":"welcome","version":1}` + "\n"},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			b, err := Encode(tc.msg)
			require.NoError(t, err)
			require.Equal(t, tc.want, string(b))
			back, err := Decode(b)
			require.NoError(t, err)
			require.Equal(t, tc.msg, back)
		})
	}
	_, err := Encode(Message{})
	require.ErrorIs(t, err, ErrMalformed)
	_, err = Encode(Message{Type: TypeError, Reason: strings.Repeat("r", MaxLine)})
	require.ErrorIs(t, err, ErrLineTooLong)
}

func TestReaderRecoversAfterBadLines(t *testing.T) {
	in := strings.Join([]string{
		`{"type":"hello","version":1,"pid":5}`,
		strings.Repeat("z", 3*MaxLine),
		`garbage`,
		`{"type":"usage","bytes":10}`,
		`{"type":"usage"`, // no newline: truncated at EOF
	}, "\n")
	r := NewReader(strings.NewReader(in))
	m, err := r.Read()
	require.NoError(t, err)
	require.Equal(t, 5, m.PID)
	_, err = r.Read()
	require.ErrorIs(t, err, ErrLineTooLong)
	_, err = r.Read()
	require.ErrorIs(t, err, ErrMalformed)
	m, err = r.Read()
	require.NoError(t, err)
	require.Equal(t, int64(10), m.Bytes)
	_, err = r.Read()
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)
}

func TestWriterOneLinePerMessage(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	require.NoError(t, w.Write(Message{Type: TypeSwapIn, ID: IntID(1)}))
	require.NoError(t, w.Write(Message{Type: TypeError, Reason: "unknown type \"x\""}))
	require.Equal(t, "{\"type\":\"swap_in\",\"id\":1}\n{\"type\":\"error\",\"reason\":\"unknown type \\\"x\\\"\"}\n", buf.String())
}

func TestValidate(t *testing.T) {
	hello := func(f func(*Message)) Message {
		m := Message{Type: TypeHello, Version: Version, PID: 42, Job: "train", Priority: 3, Device: "GPU-0f1e2d3c-aaaa-bbbb-cccc-0123456789ab", Bytes: 1 << 30}
		if f != nil {
			f(&m)
		}
		return m
	}
	tests := []struct {
		desc string
		msg  Message
		want string // "" for valid
	}{
		{"hello", hello(nil), ""},
		{"hello minimal", Message{Type: TypeHello, Version: Version}, ""},
		{"hello ordinal device", hello(func(m *Message) { m.Device = "3" }), ""},
		{"hello old MIG uuid", hello(func(m *Message) { m.Device = "MIG-GPU-0f1e2d3c-aaaa-bbbb-cccc-0123456789ab/7/0" }), ""},
		{"hello unicode job", hello(func(m *Message) { m.Job = "entraînement 2" }), ""},
		{"hello negative bytes", hello(func(m *Message) { m.Bytes = -900 << 40 }), "bytes -989560464998400 is negative"},
		{"hello absurd bytes", hello(func(m *Message) { m.Bytes = 1 << 50 }), "over the 17592186044416-byte limit"},
		{"hello negative pid", hello(func(m *Message) { m.PID = -1 }), "pid -1 is out of range"},
		{"hello huge pid", hello(func(m *Message) { m.PID = 1 << 30 }), "pid 1073741824 is out of range"},
		{"hello version", hello(func(m *Message) { m.Version = 2 }), "unsupported protocol version 2"},
		{"hello priority", hello(func(m *Message) { m.Priority = 1 << 40 }), "priority 1099511627776 is out of range"},
		{"hello negative priority", hello(func(m *Message) { m.Priority = -MaxPriority - 1 }), "priority -1000001 is out of range"},
		{"hello long job", hello(func(m *Message) { m.Job = strings.Repeat("j", MaxJob+1) }), "job is 257 bytes, over 256"},
		{"hello job with newline", hello(func(m *Message) { m.Job = "a\nb" }), "job contains control character U+000A"},
		{"hello job with escape", hello(func(m *Message) { m.Job = "a\x1b[2Jb" }), "control character U+001B"},
		{"hello job not utf-8", hello(func(m *Message) { m.Job = "a\xffb" }), "not valid UTF-8"},
		{"hello device with space", hello(func(m *Message) { m.Device = "GPU 0" }), `device "GPU 0" contains ' '`},
		{"hello long device", hello(func(m *Message) { m.Device = Device(strings.Repeat("d", MaxDevice+1)) }), "device is 97 bytes"},
		{"usage", Message{Type: TypeUsage, Bytes: 0}, ""},
		{"usage negative", Message{Type: TypeUsage, Bytes: -1}, "usage: bytes -1 is negative"},
		{"usage absurd", Message{Type: TypeUsage, Bytes: MaxBytes + 1}, "over the"},
		{"need", Message{Type: TypeNeed, ID: "1", Bytes: 5}, ""},
		{"need zero", Message{Type: TypeNeed, ID: "1"}, "bytes must be positive"},
		{"need negative", Message{Type: TypeNeed, ID: "1", Bytes: -5}, "bytes -5 is negative"},
		{"need without id", Message{Type: TypeNeed, Bytes: 5}, "missing id"},
		{"need long id", Message{Type: TypeNeed, ID: ID(`"` + strings.Repeat("i", MaxID) + `"`), Bytes: 5}, "id is 66 bytes"},
		{"progress", Message{Type: TypeProgress, ID: "2", Done: 1, Total: 2}, ""},
		{"progress done over total", Message{Type: TypeProgress, ID: "2", Done: 3, Total: 2}, "done 3 exceeds total 2"},
		{"progress negative", Message{Type: TypeProgress, ID: "2", Done: -1, Total: 2}, "done -1 is negative"},
		{"result", Message{Type: TypeResult, ID: "3", OK: true, Bytes: 9, Seconds: 0.5}, ""},
		{"result failure", Message{Type: TypeResult, ID: "3", Error: "cannot get 5 bytes back"}, ""},
		{"result negative seconds", Message{Type: TypeResult, ID: "3", Seconds: -1}, "seconds -1 is out of range"},
		{"result long error", Message{Type: TypeResult, ID: "3", Error: strings.Repeat("e", MaxText+1)}, "error is 1025 bytes"},
		{"result negative bytes", Message{Type: TypeResult, ID: "3", Bytes: -7}, "bytes -7 is negative"},
		{"daemon type ignored", Message{Type: TypeWelcome, Bytes: -1}, ""},
		{"unknown type ignored", Message{Type: "telemetry", Bytes: -1}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			err := tc.msg.Validate()
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrInvalid)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func TestValidateDecodedLines(t *testing.T) {
	// What a hostile shim writes, through the real decoder.
	for _, line := range []string{
		`{"type":"hello","version":1,"pid":1,"bytes":-900000000000000}`,
		`{"type":"usage","bytes":-1}`,
		`{"type":"usage","bytes":9223372036854775807}`,
		`{"type":"need","id":1,"bytes":-1}`,
		`{"type":"result","id":1,"ok":true,"seconds":-0.5}`,
	} {
		m, err := Decode([]byte(line))
		require.NoError(t, err, line)
		require.ErrorIs(t, m.Validate(), ErrInvalid, line)
	}
	_, err := Decode([]byte(`{"type":"usage","bytes":9223372036854775808}`))
	require.ErrorIs(t, err, ErrMalformed, "overflowing int64 does not decode")
}
