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
