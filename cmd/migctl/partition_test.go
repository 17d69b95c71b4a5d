package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/migctl/migctl/mig"
)

// runPartition runs "migctl partition args..." in-process.
func runPartition(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	root := newRootCmd(streams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut})
	root.SetArgs(append([]string{"partition"}, args...))
	err := root.Execute()
	return out.String(), errOut.String(), err
}

func simArgs(state string) []string { return []string{"--sim", "h200x8", "--sim-state", state} }

func TestPartitionRoundTrip(t *testing.T) {
	state := filepath.Join(t.TempDir(), "node.json")
	sim := simArgs(state)
	layout := "3g.71gb=1,2g.35gb=1,1g.18gb=1"

	out, _, err := runPartition(t, append([]string{"show", "-o", "json"}, sim...)...)
	require.NoError(t, err)
	var fresh struct {
		GPUs []struct {
			MIGEnabled bool
			Instances  []any
		}
	}
	require.NoError(t, json.Unmarshal([]byte(out), &fresh))
	require.Len(t, fresh.GPUs, 8)
	for _, g := range fresh.GPUs {
		require.False(t, g.MIGEnabled, "a fresh node starts with MIG off")
		require.Empty(t, g.Instances)
	}

	_, _, err = runPartition(t, append([]string{"assert", "--gpus", "all", "--layout", layout}, sim...)...)
	require.ErrorContains(t, err, "MIG mode is disabled")

	out, progress, err := runPartition(t, append([]string{"apply", "--gpus", "all", "--layout", layout}, sim...)...)
	require.NoError(t, err)
	require.Equal(t, 8, strings.Count(out, "applied"))
	require.Contains(t, progress, "GPU 7: [7/7]")

	_, _, err = runPartition(t, append([]string{"assert", "--gpus", "all", "--layout", layout}, sim...)...)
	require.NoError(t, err)

	out, _, err = runPartition(t, append([]string{"show"}, sim...)...)
	require.NoError(t, err)
	require.Equal(t, 24, strings.Count(out, "MIG-"), out)

	exported, _, err := runPartition(t, append([]string{"export"}, sim...)...)
	require.NoError(t, err)
	require.Contains(t, exported, "devices: all")
	file := filepath.Join(t.TempDir(), "layout.yaml")
	require.NoError(t, os.WriteFile(file, []byte(exported), 0o644))

	// the export applied to a fresh node reproduces the layout exactly
	state2 := filepath.Join(t.TempDir(), "node2.json")
	_, _, err = runPartition(t, append([]string{"apply", "-f", file}, simArgs(state2)...)...)
	require.NoError(t, err)
	again, _, err := runPartition(t, append([]string{"export"}, simArgs(state2)...)...)
	require.NoError(t, err)
	require.Equal(t, exported, again)
	_, _, err = runPartition(t, append([]string{"assert", "-f", file, "-c", "current"}, sim...)...)
	require.NoError(t, err)

	// applying again changes nothing
	out, _, err = runPartition(t, append([]string{"apply", "--gpus", "all", "--layout", layout}, sim...)...)
	require.NoError(t, err)
	require.Equal(t, 8, strings.Count(out, "unchanged"))

	// mode disable tears down and turns MIG off
	_, _, err = runPartition(t, append([]string{"mode", "disable", "--gpus", "3"}, sim...)...)
	require.NoError(t, err)
	_, _, err = runPartition(t, append([]string{"assert", "--gpus", "3", "--layout", layout}, sim...)...)
	require.ErrorContains(t, err, "GPU 3: MIG mode is disabled")
	out, _, err = runPartition(t, append([]string{"mode", "enable", "--gpus", "3"}, sim...)...)
	require.NoError(t, err)
	require.Contains(t, out, "changed")
}

func TestPartitionBadInputChangesNothing(t *testing.T) {
	state := filepath.Join(t.TempDir(), "node.json")
	sim := simArgs(state)
	_, _, err := runPartition(t, append([]string{"apply", "--gpus", "0", "--layout", "2g.35gb=1"}, sim...)...)
	require.NoError(t, err)
	before, err := os.ReadFile(state)
	require.NoError(t, err)

	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(body), 0o644))
		return p
	}
	bad := write("bad.yaml", "version: v1\nmig-configs:\n  x:\n    - devices: all\n      mig-enabled: true\n      mig-devices:\n        \"1g.18gb\": [\n")
	unknown := write("unknown.yaml", "version: v1\nmig-configs:\n  x:\n    - devices: all\n      mig-enabled: true\n      mig-devices:\n        \"1g.18gb\": 1\n        \"5g.99gb\": 1\n")
	lacks := write("lacks.yaml", "version: v1\nmig-configs:\n  x:\n    - devices: [0]\n      mig-enabled: true\n      mig-devices:\n        \"1g.10gb\": 2\n")
	rng := write("range.yaml", "version: v1\nmig-configs:\n  x:\n    - devices: [0, 8]\n      mig-enabled: true\n      mig-devices:\n        \"1g.18gb\": 2\n")
	over := write("over.yaml", "version: v1\nmig-configs:\n  x:\n    - devices: all\n      mig-enabled: true\n      mig-devices:\n        \"3g.71gb\": 3\n")
	pins := write("pins.yaml", "version: v1\nmig-configs:\n  x:\n    - devices: all\n      mig-enabled: true\n      mig-devices:\n        \"3g.71gb\": 1\n        \"2g.35gb\": 1\n      mig-placements:\n        \"3g.71gb\": [0]\n        \"2g.35gb\": [2]\n")
	infeasible := write("infeasible.yaml", "version: v1\nmig-configs:\n  x:\n    - devices: all\n      mig-enabled: true\n      mig-devices:\n        \"1g.35gb\": 4\n        \"1g.18gb\": 1\n")
	tests := []struct {
		name string
		args []string
		want []string // substrings of the one-line error
	}{
		{"malformed YAML", []string{"-f", bad}, []string{"bad.yaml", "line"}},
		{"unknown profile", []string{"-f", unknown}, []string{"unknown.yaml:8", "5g.99gb"}},
		{"profile the GPU lacks", []string{"-f", lacks}, []string{"lacks.yaml:7", "1g.10gb", "has no profile"}},
		{"device out of range", []string{"-f", rng}, []string{"range.yaml:4", "device 8 out of range"}},
		{"count over maximum", []string{"-f", over}, []string{"over.yaml:7", "at most 2"}},
		{"conflicting placements", []string{"-f", pins}, []string{"pins.yaml", "overlaps"}},
		{"infeasible", []string{"-f", infeasible}, []string{"cannot place 1g.18gb", "free memory units"}},
		{"unknown --layout profile", []string{"--layout", "9g.1gb=1"}, []string{"9g.1gb"}},
		{"--gpus out of range", []string{"--layout", "1g.18gb=1", "--gpus", "0,12"}, []string{"device 12 out of range"}},
		{"no config name", []string{"-f", pins, "-c", "nope"}, []string{"no configuration \"nope\""}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := runPartition(t, append(append([]string{"apply"}, tc.args...), sim...)...)
			require.Error(t, err)
			msg := err.Error()
			require.NotContains(t, msg, "\n", "one-line reason")
			for _, w := range tc.want {
				require.Contains(t, msg, w)
			}
			after, err := os.ReadFile(state)
			require.NoError(t, err)
			require.Equal(t, string(before), string(after), "bad input must change nothing")
		})
	}
}

func TestPartitionPlanAndDryRun(t *testing.T) {
	state := filepath.Join(t.TempDir(), "node.json")
	sim := simArgs(state)
	_, _, err := runPartition(t, append([]string{"apply", "--gpus", "0", "--layout", "7g.141gb=1"}, sim...)...)
	require.NoError(t, err)
	out, _, err := runPartition(t, append([]string{"plan", "--gpus", "0", "--layout", "3g.71gb=2", "-o", "json"}, sim...)...)
	require.NoError(t, err)
	require.Contains(t, out, `"op": "destroy-gi"`)
	out, _, err = runPartition(t, append([]string{"apply", "--dry-run", "--gpus", "0", "--layout", "3g.71gb=2"}, sim...)...)
	require.NoError(t, err)
	require.Contains(t, out, "destroy GPU instance 7g.141gb@0:8")
	_, _, err = runPartition(t, append([]string{"assert", "--gpus", "0", "--layout", "7g.141gb=1"}, sim...)...)
	require.NoError(t, err, "--dry-run changes nothing")
}

func TestPartitionBusyInstanceViaSimProcess(t *testing.T) {
	state := filepath.Join(t.TempDir(), "node.json")
	sim := []string{"--sim", "h200", "--sim-state", state}
	_, _, err := runPartition(t, append([]string{"apply", "--layout", "3g.71gb@4"}, sim...)...)
	require.NoError(t, err)
	_, _, err = runPartition(t, append([]string{"sim", "attach", "--gpus", "0", "--gi", "2", "--ci", "0", "--pid", "4242"}, sim...)...)
	require.NoError(t, err)

	out, _, err := runPartition(t, append([]string{"show"}, sim...)...)
	require.NoError(t, err)
	require.Contains(t, out, "4242")
	_, _, err = runPartition(t, append([]string{"apply", "--layout", "7g.141gb=1"}, sim...)...)
	require.ErrorContains(t, err, "has processes")
	// --force plans the destroy, but NVML still answers IN_USE and the GPU is rolled back
	_, _, err = runPartition(t, append([]string{"apply", "--force", "--layout", "7g.141gb=1"}, sim...)...)
	require.ErrorContains(t, err, "rolled back")
	_, _, err = runPartition(t, append([]string{"assert", "--layout", "3g.71gb@4"}, sim...)...)
	require.NoError(t, err)
	// planned around the busy instance
	_, _, err = runPartition(t, append([]string{"apply", "--layout", "3g.71gb=1,2g.35gb=2"}, sim...)...)
	require.NoError(t, err)
	_, _, err = runPartition(t, append([]string{"assert", "--layout", "3g.71gb@4,2g.35gb@0,2g.35gb@2"}, sim...)...)
	require.NoError(t, err)
	_, _, err = runPartition(t, append([]string{"sim", "attach", "--gpus", "0", "--gi", "2", "--ci", "0", "--pid", "4242"}, sim...)...)
	require.ErrorContains(t, err, "attached already")
	_, _, err = runPartition(t, append([]string{"sim", "attach", "--gpus", "0", "--gi", "2", "--ci", "0", "--pid", "4243", "--bytes", "80GiB"}, sim...)...)
	require.ErrorContains(t, err, "GiB free", "a 3g.71gb instance has 69.75 GiB")
	_, _, err = runPartition(t, append([]string{"sim", "detach", "--gpus", "0", "--pid", "4242"}, sim...)...)
	require.NoError(t, err)
	_, _, err = runPartition(t, append([]string{"sim", "detach", "--pid", "4242"}, sim...)...)
	require.ErrorContains(t, err, "process 4242 runs on none of the selected GPUs")
	_, _, err = runPartition(t, append([]string{"apply", "--layout", "7g.141gb=1"}, sim...)...)
	require.NoError(t, err)
}

func TestPartitionPendingModeOnAmpere(t *testing.T) {
	state := filepath.Join(t.TempDir(), "node.json")
	sim := []string{"--sim", "a100-40gbx2", "--sim-state", state}
	out, hint, err := runPartition(t, append([]string{"mode", "enable", "--gpus", "1"}, sim...)...)
	require.NoError(t, err)
	require.Contains(t, out, "pending")
	require.Contains(t, out, "nvidia-smi -r -i 1")
	require.Contains(t, hint, "sim reset --sim a100-40gbx2 --sim-state "+state, "the hint names this node, not another state file")
	_, _, err = runPartition(t, append([]string{"apply", "--gpus", "1", "--layout", "1g.5gb=7"}, sim...)...)
	require.ErrorContains(t, err, "pending")
	_, _, err = runPartition(t, append([]string{"sim", "reset", "--gpus", "1"}, sim...)...)
	require.NoError(t, err)
	_, _, err = runPartition(t, append([]string{"apply", "--gpus", "1", "--layout", "1g.5gb=7"}, sim...)...)
	require.NoError(t, err)
	_, _, err = runPartition(t, append([]string{"assert", "--gpus", "1", "--layout", "1g.5gb=7"}, sim...)...)
	require.NoError(t, err)
}

func TestPartitionRecoverSaysWhatItDid(t *testing.T) {
	state := filepath.Join(t.TempDir(), "node.json")
	out, msg, err := runPartition(t, append([]string{"recover", "-o", "json"}, simArgs(state)...)...)
	require.NoError(t, err)
	require.Contains(t, out, `"outcome": "nothing"`)
	require.Contains(t, msg, "nothing to recover: no interrupted apply in "+state+".journal")
}

// TestPartitionSimAttachByMIGUUID: an admin sees MIG UUIDs in show, so a fake
// process can be attached by one; apply then keeps or refuses its instance.
func TestPartitionSimAttachByMIGUUID(t *testing.T) {
	state := filepath.Join(t.TempDir(), "node.json")
	sim := []string{"--sim", "h200x2", "--sim-state", state}
	run := func(args ...string) (string, string, error) {
		t.Helper()
		return runPartition(t, append(args, sim...)...)
	}
	_, _, err := run("apply", "--layout", "3g.71gb=2")
	require.NoError(t, err)
	out, _, err := run("show", "-o", "json", "--gpus", "1")
	require.NoError(t, err)
	var node struct {
		GPUs []struct {
			Instances []struct {
				Placement struct{ Start int }
				Compute   []struct{ UUID string } `json:"computeInstances"`
			}
		}
	}
	require.NoError(t, json.Unmarshal([]byte(out), &node))
	var uuid string
	for _, in := range node.GPUs[0].Instances {
		if in.Placement.Start == 4 {
			uuid = in.Compute[0].UUID
		}
	}
	require.NotEmpty(t, uuid)

	_, _, err = run("sim", "attach", "--mig", uuid)
	require.ErrorContains(t, err, "--pid")
	_, _, err = run("sim", "attach", "--mig", uuid, "--gpus", "0", "--pid", "31")
	require.ErrorContains(t, err, "leave out --gpus")
	_, _, err = run("sim", "attach", "--mig", "MIG-00000000-0000-0000-0000-000000000000", "--pid", "31")
	require.ErrorContains(t, err, "no such MIG device")
	out, _, err = run("sim", "attach", "--mig", uuid, "--pid", "31", "-o", "json")
	require.NoError(t, err)
	var ev struct {
		Events []struct {
			GPU    int    `json:"gpu"`
			Action string `json:"action"`
			PID    uint32 `json:"pid"`
		} `json:"events"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &ev))
	require.Len(t, ev.Events, 1)
	require.Equal(t, 1, ev.Events[0].GPU, "the MIG UUID was found on GPU 1")
	require.Equal(t, "attached", ev.Events[0].Action)
	require.Equal(t, uint32(31), ev.Events[0].PID)

	out, _, err = run("show")
	require.NoError(t, err)
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, uuid) {
			require.True(t, strings.HasSuffix(strings.TrimSpace(line), "31"), line)
		}
	}
	_, _, err = run("apply", "--gpus", "1", "--layout", "7g.141gb=1")
	require.ErrorContains(t, err, "pid 31 on "+uuid)
	_, _, err = run("apply", "--gpus", "1", "--layout", "3g.71gb=1,2g.35gb=2")
	require.NoError(t, err, "planned around the busy 3g.71gb at 4")
	out, _, err = run("show", "--gpus", "1")
	require.NoError(t, err)
	require.Contains(t, out, uuid, "the busy MIG device survived with its UUID")
}

// TestPartitionReadOnlyCommandsNoteAnInterruptedApply: show, plan and assert
// say when the journal holds an interrupted apply, so a half-changed GPU is
// not taken for the admin's layout; recover clears it.
func TestPartitionReadOnlyCommandsNoteAnInterruptedApply(t *testing.T) {
	state := filepath.Join(t.TempDir(), "node.json")
	sim := simArgs(state)
	out, _, err := runPartition(t, append([]string{"show", "-o", "json", "--gpus", "2"}, sim...)...)
	require.NoError(t, err)
	var node struct {
		GPUs []struct{ UUID string } `json:"gpus"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &node))
	// an apply of 7g.141gb on GPU 2 that died after its first step
	j := mig.NewJournal(state + ".journal")
	require.NoError(t, j.Begin(&mig.Tx{ID: "t", GPU: 2, UUID: node.GPUs[0].UUID, MIGEnabled: true,
		Target: mig.Layout{{Profile: "7g.141gb", Placement: mig.Placement{Start: 0, Size: 8}, CISlices: []int{7}}},
		Steps:  []mig.Step{{Op: mig.OpEnableMIG}, {Op: mig.OpCreateGI, Profile: "7g.141gb", Placement: mig.Placement{Start: 0, Size: 8}}}}))
	require.NoError(t, j.Step(1))

	for _, args := range [][]string{{"show"}, {"plan", "--layout", "none"}, {"assert", "--layout", "none"}} {
		_, msg, _ := runPartition(t, append(args, sim...)...)
		require.Contains(t, msg, "note: an apply was interrupted on GPU 2 (1 of 2 steps done", args[0])
		require.Contains(t, msg, "migctl partition recover", args[0])
	}
	_, _, err = runPartition(t, append([]string{"recover"}, sim...)...)
	require.NoError(t, err)
	_, msg, err := runPartition(t, append([]string{"assert", "--gpus", "2", "--layout", "7g.141gb=1"}, sim...)...)
	require.NoError(t, err)
	require.NotContains(t, msg, "interrupted")
}

// countingWriter counts Write calls.
type countingWriter struct {
	bytes.Buffer
	writes int
}

func (w *countingWriter) Write(p []byte) (int, error) {
	w.writes++
	return w.Buffer.Write(p)
}

// TestPartitionOutputIsOneWrite: each command writes its result with one
// write, so 'migctl partition show | head -3' under 'set -o pipefail' (the
// demo script does this) cannot catch migctl with SIGPIPE halfway through a
// table.
func TestPartitionOutputIsOneWrite(t *testing.T) {
	state := filepath.Join(t.TempDir(), "node.json")
	sim := simArgs(state)
	_, _, err := runPartition(t, append([]string{"apply", "--layout", "3g.71gb=1,2g.35gb=1,1g.18gb=1"}, sim...)...)
	require.NoError(t, err)
	for _, args := range [][]string{
		{"show"}, {"show", "-o", "json"}, {"show", "-o", "yaml"}, {"profiles"},
		{"plan", "--layout", "7g.141gb=1"}, {"assert", "--layout", "3g.71gb=1,2g.35gb=1,1g.18gb=1"},
		{"apply", "--layout", "3g.71gb=1,2g.35gb=1,1g.18gb=1"}, {"recover"}, {"mode", "enable"},
	} {
		var out countingWriter
		root := newRootCmd(streams{In: strings.NewReader(""), Out: &out, ErrOut: &bytes.Buffer{}})
		root.SetArgs(append(append([]string{"partition"}, args...), sim...))
		require.NoError(t, root.Execute(), "%v", args)
		require.Greater(t, out.Len(), 0, "%v", args)
		require.Equal(t, 1, out.writes, "%v: output in %d writes", args, out.writes)
	}
}

// TestPartitionEmptyGPUsIsAnError: every partition command that takes --gpus
// refuses an empty selection (a shell variable that expanded to nothing) and
// changes nothing; only 'all' (or leaving the flag out) means every GPU.
func TestPartitionEmptyGPUsIsAnError(t *testing.T) {
	state := filepath.Join(t.TempDir(), "node.json")
	sim := simArgs(state)
	_, _, err := runPartition(t, append([]string{"apply", "--gpus", "0", "--layout", "2g.35gb=1"}, sim...)...)
	require.NoError(t, err)
	before, err := os.ReadFile(state)
	require.NoError(t, err)

	layout := []string{"--layout", "1g.18gb=1"}
	tests := [][]string{
		{"profiles"},
		{"show"},
		{"export"},
		append([]string{"plan"}, layout...),
		append([]string{"apply"}, layout...),
		append([]string{"assert"}, layout...),
		{"mode", "enable"},
		{"mode", "disable", "--force"},
		{"sim", "reset"},
		{"sim", "attach", "--pid", "42", "--gi", "-1"},
		{"sim", "detach", "--pid", "42"},
	}
	for _, args := range tests {
		for _, empty := range []string{"", " ", "0,,1"} {
			t.Run(strings.Join(args[:min(2, len(args))], " ")+"/"+empty, func(t *testing.T) {
				_, _, err := runPartition(t, append(append(args, "--gpus", empty), sim...)...)
				require.ErrorIs(t, err, mig.ErrBadConfig)
				require.ErrorContains(t, err, "empty")
				after, err := os.ReadFile(state)
				require.NoError(t, err)
				require.Equal(t, string(before), string(after), "an empty --gpus must change nothing")
			})
		}
	}
	// leaving the flag out still means every GPU
	out, _, err := runPartition(t, append([]string{"profiles", "-o", "json"}, sim...)...)
	require.NoError(t, err)
	require.Contains(t, out, `"gpus": [`)
	_, _, err = runPartition(t, append([]string{"plan", "--layout", "1g.18gb=1"}, sim...)...)
	require.NoError(t, err)
	// and --gpus still does not go with -f, even as 'all'
	_, _, err = runPartition(t, append([]string{"plan", "-f", state, "--gpus", "all"}, sim...)...)
	require.ErrorContains(t, err, "--gpus goes with --layout")
}

// TestPartitionFileMustBeARegularFile: -f /dev/zero fails at once (before,
// it read until the OOM killer came), and -f - reads the layout from stdin.
func TestPartitionFileMustBeARegularFile(t *testing.T) {
	state := filepath.Join(t.TempDir(), "node.json")
	sim := simArgs(state)
	for _, cmd := range []string{"plan", "apply", "assert"} {
		_, _, err := runPartition(t, append([]string{cmd, "-f", "/dev/zero"}, sim...)...)
		require.ErrorIs(t, err, mig.ErrBadConfig, cmd)
		require.ErrorContains(t, err, "/dev/zero is not a regular file")
	}

	layout := "version: v1\nmig-configs:\n  x:\n    - devices: [0]\n      mig-enabled: true\n      mig-devices:\n        \"2g.35gb\": 3\n"
	var out, errOut bytes.Buffer
	root := newRootCmd(streams{In: strings.NewReader(layout), Out: &out, ErrOut: &errOut})
	root.SetArgs(append([]string{"partition", "apply", "-f", "-"}, sim...))
	require.NoError(t, root.Execute(), errOut.String())
	_, _, err := runPartition(t, append([]string{"assert", "--gpus", "0", "--layout", "2g.35gb=3"}, sim...)...)
	require.NoError(t, err, "the layout read from stdin was applied")

	root = newRootCmd(streams{In: strings.NewReader(strings.Repeat("#", mig.MaxConfigBytes+1)), Out: &out, ErrOut: &errOut})
	root.SetArgs(append([]string{"partition", "plan", "-f", "-"}, sim...))
	require.ErrorContains(t, root.Execute(), "standard input holds more than 1048576 bytes")
}

// TestRunEmptyGPUsIsAnError: migctl run refuses an empty --gpus (before, it
// value read as "no --gpus") and an empty entry, before starting anything.
func TestRunEmptyGPUsIsAnError(t *testing.T) {
	for _, v := range []string{"", " ", "0,,1"} {
		var out, errOut bytes.Buffer
		root := newRootCmd(streams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut})
		root.SetArgs([]string{"run", "--np", "1", "--backend", "host", "--gpus", v, "--", "true"})
		err := root.Execute()
		require.ErrorContains(t, err, "--gpus", "--gpus %q", v)
		require.Empty(t, out.String(), "nothing ran")
	}
}

// TestPartitionJSONSaysWhatYAMLSays: -o json and -o yaml print the same
// document, empty layouts and step lists included ([] in both, never null in
// JSON only), on a fresh node and on one with MIG on and no instances.
func TestPartitionJSONSaysWhatYAMLSays(t *testing.T) {
	state := filepath.Join(t.TempDir(), "node.json")
	sim := simArgs(state)
	decode := func(t *testing.T, format, out string) any {
		t.Helper()
		var v any
		if format == "json" {
			require.NoError(t, json.Unmarshal([]byte(out), &v))
			return v
		}
		require.NoError(t, yaml.Unmarshal([]byte(out), &v))
		b, err := json.Marshal(v) // YAML's ints and JSON's numbers compare alike
		require.NoError(t, err)
		require.NoError(t, json.Unmarshal(b, &v))
		return v
	}
	tests := []struct {
		name  string
		setup []string // run once before, not compared
		args  []string
	}{
		{"plan on a fresh node", nil, []string{"plan", "--layout", "none"}},
		{"dry run on a fresh node", nil, []string{"apply", "--dry-run", "--layout", "none"}},
		{"show on a fresh node", nil, []string{"show"}},
		{"no-op plan", []string{"apply", "--layout", "none"}, []string{"plan", "--layout", "none"}},
		{"unchanged apply", nil, []string{"apply", "--layout", "none"}},
		{"assert", nil, []string{"assert", "--layout", "none"}},
		{"show", nil, []string{"show"}},
		{"recover", nil, []string{"recover"}},
		{"mode enable", nil, []string{"mode", "enable"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.setup != nil {
				_, _, err := runPartition(t, append(tc.setup, sim...)...)
				require.NoError(t, err)
			}
			var got []any
			for _, f := range []string{"json", "yaml"} {
				out, _, err := runPartition(t, append(append(tc.args, "-o", f), sim...)...)
				require.NoError(t, err)
				got = append(got, decode(t, f, out))
			}
			require.Equal(t, got[1], got[0], "-o json (want) differs from -o yaml")
		})
	}
}
