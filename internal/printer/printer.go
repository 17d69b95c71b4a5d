package printer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"go.yaml.in/yaml/v3"
)

// Format is an output format accepted by -o.
type Format string

// The formats every command accepts.
const (
	Table Format = "table"
	JSON  Format = "json"
	YAML  Format = "yaml"
)

// Formats lists the accepted values of -o, for help texts.
var Formats = []string{string(Table), string(JSON), string(YAML)}

// ParseFormat validates a user-supplied -o value.
func ParseFormat(s string) (Format, error) {
	switch f := Format(strings.ToLower(strings.TrimSpace(s))); f {
	case Table, JSON, YAML:
		return f, nil
	case "":
		return Table, nil
	default:
		return "", fmt.Errorf("unknown output format %q (want one of %s)", s, strings.Join(Formats, ", "))
	}
}

// Tabler is implemented by values that can print themselves as a table.
// Header returns the column names; Rows the cells, one slice per row.
type Tabler interface {
	Header() []string
	Rows() [][]string
}

// Print writes v to w in format f. Values printed as tables must implement
// Tabler; any value can be printed as JSON or YAML.
//
// The output is rendered first and written with one Write, and nothing is
// written when rendering fails: a reader that stops early ('migctl partition
// show | head', under 'set -o pipefail') then sees the command succeed
// instead of killing it with SIGPIPE halfway through a table written cell by
// cell.
func Print(w io.Writer, f Format, v any) error {
	var buf bytes.Buffer
	if err := render(&buf, f, v); err != nil {
		return err
	}
	_, err := w.Write(buf.Bytes())
	return err
}

func render(w io.Writer, f Format, v any) error {
	switch f {
	case JSON:
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		if err := enc.Encode(v); err != nil {
			return fmt.Errorf("encoding JSON: %w", err)
		}
		return nil
	case YAML:
		enc := yaml.NewEncoder(w)
		enc.SetIndent(2)
		if err := enc.Encode(v); err != nil {
			return fmt.Errorf("encoding YAML: %w", err)
		}
		return enc.Close()
	case Table, "":
		t, ok := v.(Tabler)
		if !ok {
			return fmt.Errorf("%T cannot be printed as a table", v)
		}
		return WriteTable(w, t.Header(), t.Rows())
	default:
		return fmt.Errorf("unknown output format %q", f)
	}
}

// WriteTable writes an aligned table with an upper-case header line.
func WriteTable(w io.Writer, header []string, rows [][]string) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if len(header) > 0 {
		up := make([]string, len(header))
		for i, h := range header {
			up[i] = strings.ToUpper(h)
		}
		fmt.Fprintln(tw, strings.Join(up, "\t"))
	}
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	return tw.Flush()
}
