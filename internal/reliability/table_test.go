package reliability

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestMarkdown(t *testing.T) {
	rows := []Row{
		{Area: "daemon", Class: "negative bytes", Trials: 3, Expected: "disconnected", Worst: 1500 * time.Microsecond, Note: "3 logged"},
		{Area: "bench", Class: "rank | stopped", Trials: 2, Failed: 1, Failures: []string{"took 40s\n(limit 10s)"}, Expected: "x"},
		{Area: "daemon", Class: "refused uid", Skipped: "needs root"},
	}
	md := Markdown("Machine: test.", rows)
	require.Contains(t, md, "| daemon | negative bytes | 3 | ok: disconnected (3 logged) | 2ms |\n")
	require.Contains(t, md, `| bench | rank \| stopped | 2 | FAIL (1/2): took 40s (limit 10s) (expected: x) | – |`)
	require.Contains(t, md, "| daemon | refused uid | 0 | SKIPPED: needs root | – |")
	require.Contains(t, md, "Machine: test.")
	require.Contains(t, md, "3 fault classes, 5 trials; 1 classes with failures.")
	require.Equal(t, 1, strings.Count(md, "\n|---|"), "one table")
}
