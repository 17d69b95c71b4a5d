package printer

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

type gpus []struct {
	Index int    `json:"index" yaml:"index"`
	Name  string `json:"name" yaml:"name"`
}

func (g gpus) Header() []string { return []string{"index", "name"} }
func (g gpus) Rows() [][]string {
	var out [][]string
	for _, x := range g {
		out = append(out, []string{string(rune('0' + x.Index)), x.Name})
	}
	return out
}

func TestParseFormat(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    Format
		wantErr bool
	}{
		{"table", Table, false}, {"JSON", JSON, false}, {" yaml ", YAML, false}, {"", Table, false}, {"xml", "", true},
	} {
		t.Run(tc.in, func(t *testing.T) {
			f, err := ParseFormat(tc.in)
			if tc.wantErr {
				require.ErrorContains(t, err, "unknown output format")
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, f)
		})
	}
}

func TestPrintRoundTrips(t *testing.T) {
	v := gpus{{0, "NVIDIA H200"}, {1, "NVIDIA H200"}}

	var b bytes.Buffer
	require.NoError(t, Print(&b, Table, v))
	require.Equal(t, "INDEX  NAME\n0      NVIDIA H200\n1      NVIDIA H200\n", b.String())

	b.Reset()
	require.NoError(t, Print(&b, JSON, v))
	var fromJSON gpus
	require.NoError(t, json.Unmarshal(b.Bytes(), &fromJSON))
	require.Equal(t, v, fromJSON)

	b.Reset()
	require.NoError(t, Print(&b, YAML, v))
	var fromYAML gpus
	require.NoError(t, yaml.Unmarshal(b.Bytes(), &fromYAML))
	require.Equal(t, v, fromYAML)

	require.ErrorContains(t, Print(&b, Table, 42), "cannot be printed as a table")
}

// writeCounter records each Write separately.
type writeCounter struct{ writes []string }

func (w *writeCounter) Write(p []byte) (int, error) {
	w.writes = append(w.writes, string(p))
	return len(p), nil
}

func TestPrintWritesOnce(t *testing.T) {
	v := gpus{{0, "NVIDIA H200"}, {1, "NVIDIA H200"}}
	for _, f := range []Format{Table, JSON, YAML} {
		t.Run(string(f), func(t *testing.T) {
			var want bytes.Buffer
			require.NoError(t, Print(&want, f, v))
			var w writeCounter
			require.NoError(t, Print(&w, f, v))
			require.Equal(t, []string{want.String()}, w.writes)
		})
	}
	t.Run("nothing written when rendering fails", func(t *testing.T) {
		var w writeCounter
		require.Error(t, Print(&w, Table, 42))
		require.Empty(t, w.writes)
	})
}
