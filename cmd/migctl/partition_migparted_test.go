package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// A mig-parted v1 file in mig-parted's own shapes: several configurations,
// `devices: all` and lists, device-filter as a string and as a list, entries
// for other GPUs beside the H200's, `mig-enabled: false`, `mig-devices: {}`.
const migPartedFile = `version: v1
mig-configs:
  off:
    - devices: all
      mig-enabled: false

  on-empty:
    - devices: all
      mig-enabled: true
      mig-devices: {}

  by-model:
    - device-filter: ["0x20B010DE", "0x20B210DE"]   # A100s: not on this node
      devices: all
      mig-enabled: true
      mig-devices:
        "1g.5gb": 7
    - device-filter: "0x233510DE"                    # H200
      devices: all
      mig-enabled: true
      mig-devices:
        "2g.35gb": 2
        "1g.35gb": 2

  per-gpu:
    - devices: [0, 1]
      mig-enabled: false
    - devices: [2]
      mig-enabled: true
      mig-devices:
        "4g.71gb": 1
        "3g.71gb": 1
    - devices: [3]
      mig-enabled: true
      mig-devices:
        "1c.7g.141gb": 7

  other-gpus-only:
    - device-filter: "0x20B010DE"
      devices: all
      mig-enabled: true
      mig-devices:
        "1g.5gb": 7
`

func TestPartitionMigPartedFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "config.yaml")
	require.NoError(t, os.WriteFile(file, []byte(migPartedFile), 0o644))
	sim := []string{"--sim", "h200x4", "--sim-state", filepath.Join(dir, "node.json")}
	run := func(args ...string) (string, string, error) {
		t.Helper()
		return runPartition(t, append(args, sim...)...)
	}

	// several configurations and no -c: the error lists them
	_, _, err := run("apply", "-f", file)
	require.ErrorContains(t, err, "pick one with -c")
	_, _, err = run("apply", "-f", file, "-c", "nope")
	require.ErrorContains(t, err, `no configuration "nope" (have: off, on-empty, by-model, per-gpu, other-gpus-only)`)

	// device-filter picks the H200 entry; the A100 profiles are never checked
	_, _, err = run("apply", "-f", file, "-c", "by-model")
	require.NoError(t, err)
	_, _, err = run("assert", "-f", file, "-c", "by-model")
	require.NoError(t, err)
	_, _, err = run("assert", "--layout", "2g.35gb=2,1g.35gb=2")
	require.NoError(t, err)

	// mig-devices: {} is MIG on with no instances, from a partitioned node
	_, _, err = run("apply", "-f", file, "-c", "on-empty")
	require.NoError(t, err)
	_, _, err = run("assert", "-f", file, "-c", "on-empty")
	require.NoError(t, err)
	_, _, err = run("assert", "--layout", "none")
	require.NoError(t, err)

	out, _, err := run("apply", "-f", file, "-c", "per-gpu")
	require.NoError(t, err)
	require.Equal(t, 2, strings.Count(out, "MIG disabled"), "GPUs turned off say so, not 'empty':\n%s", out)
	out, _, err = run("assert", "-f", file, "-c", "per-gpu")
	require.NoError(t, err)
	require.Equal(t, 2, strings.Count(out, "MIG disabled"), out)
	out, _, err = run("show", "-o", "json")
	require.NoError(t, err)
	var node struct {
		GPUs []struct {
			MIGEnabled bool `json:"migEnabled"`
			Instances  []struct {
				Profile string `json:"profile"`
			} `json:"instances"`
		} `json:"gpus"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &node))
	require.False(t, node.GPUs[0].MIGEnabled)
	require.False(t, node.GPUs[1].MIGEnabled)
	require.True(t, node.GPUs[2].MIGEnabled)
	require.Len(t, node.GPUs[2].Instances, 2)
	require.Len(t, node.GPUs[3].Instances, 1, "seven 1-slice compute instances share one 7g GPU instance")

	// --mig-parted export: strict mig-parted v1 (no mig-placements), which
	// migctl reads back to the same instances
	strict, _, err := run("export", "--mig-parted", "--name", "saved")
	require.NoError(t, err)
	require.NotContains(t, strict, "mig-placements")
	var spec map[string]any
	require.NoError(t, yaml.Unmarshal([]byte(strict), &spec))
	require.ElementsMatch(t, []string{"version", "mig-configs"}, keys(spec))
	for _, e := range spec["mig-configs"].(map[string]any)["saved"].([]any) {
		for k := range e.(map[string]any) {
			require.Contains(t, []string{"devices", "device-filter", "mig-enabled", "mig-devices"}, k, "a key mig-parted refuses")
		}
	}
	strictFile := filepath.Join(dir, "strict.yaml")
	require.NoError(t, os.WriteFile(strictFile, []byte(strict), 0o644))
	_, _, err = run("assert", "-f", strictFile)
	require.NoError(t, err)

	// the default export keeps placements; -o json is the same document
	withPl, _, err := run("export")
	require.NoError(t, err)
	require.Contains(t, withPl, "mig-placements")
	js, _, err := run("export", "-o", "json")
	require.NoError(t, err)
	var fromYAML, fromJSON any
	require.NoError(t, yaml.Unmarshal([]byte(withPl), &fromYAML))
	require.NoError(t, json.Unmarshal([]byte(js), &fromJSON))
	require.Equal(t, normalise(t, fromYAML), normalise(t, fromJSON))
	jsFile := filepath.Join(dir, "layout.json")
	require.NoError(t, os.WriteFile(jsFile, []byte(js), 0o644))
	_, _, err = run("assert", "-f", jsFile)
	require.NoError(t, err)
	_, _, err = run("export", "-o", "table")
	require.ErrorContains(t, err, "-o yaml")

	// a configuration that selects no GPU here is an error, not a silent success
	for _, verb := range []string{"plan", "apply", "assert"} {
		_, _, err = run(verb, "-f", file, "-c", "other-gpus-only")
		require.ErrorContains(t, err, `configuration "other-gpus-only" selects no GPU of this node`, verb)
		require.ErrorContains(t, err, "0x233510DE", verb)
	}

	_, _, err = run("apply", "-f", file, "-c", "off")
	require.NoError(t, err)
	out, _, err = run("show")
	require.NoError(t, err)
	require.Equal(t, 4, strings.Count(out, "Disabled"), out)
}

func keys(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// normalise round-trips v through JSON so YAML's and JSON's number types
// compare equal.
func normalise(t *testing.T, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	var out any
	require.NoError(t, json.Unmarshal(b, &out))
	return out
}
