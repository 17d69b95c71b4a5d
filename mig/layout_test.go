package mig_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/mig"
	"github.com/migctl/migctl/mig/migsim"
)

func node8(t *testing.T) *mig.Node {
	t.Helper()
	n, err := mig.Discover(migsim.New(migsim.H200, 8))
	require.NoError(t, err)
	return n
}

func TestConfigFileResolves(t *testing.T) {
	data, err := os.ReadFile("testdata/h200-layouts.yaml")
	require.NoError(t, err)
	cfg, err := mig.ParseConfig(data, "h200-layouts.yaml")
	require.NoError(t, err)
	require.Equal(t, []string{"all-disabled", "all-1g.18gb", "balanced", "mixed", "pinned", "other-gpu-only"}, cfg.Names())
	node := node8(t)

	tests := []struct {
		config string
		gpus   []int
		check  func(t *testing.T, reqs map[int]mig.Request)
	}{
		{"all-disabled", []int{0, 1, 2, 3, 4, 5, 6, 7}, func(t *testing.T, r map[int]mig.Request) { require.False(t, r[3].MIGEnabled) }},
		{"balanced", []int{0, 1, 2, 3, 4, 5, 6, 7}, func(t *testing.T, r map[int]mig.Request) {
			require.Equal(t, "1g.18gb=1,2g.35gb=1,3g.71gb=1", r[5].String())
		}},
		{"mixed", []int{0, 1, 2, 3, 4, 5, 6, 7}, func(t *testing.T, r map[int]mig.Request) {
			require.Equal(t, "3g.71gb=2", r[2].String())
			require.Equal(t, "4g.71gb=1,3g.71gb=1", r[4].String(), "bus 9A is GPU 4")
			require.Equal(t, "4g.71gb=1,3g.71gb=1", r[5].String(), "bus AB is GPU 5")
			require.Equal(t, "1c.7g.141gb=7", r[6].String())
			require.False(t, r[7].MIGEnabled)
		}},
		{"pinned", []int{0, 1, 2, 3, 4, 5, 6, 7}, func(t *testing.T, r map[int]mig.Request) {
			require.Equal(t, "3g.71gb@4,2g.35gb@2,2g.35gb@0", r[0].String())
		}},
		{"other-gpu-only", nil, nil},
	}
	for _, tc := range tests {
		t.Run(tc.config, func(t *testing.T) {
			reqs, err := cfg.Requests(tc.config, node)
			require.NoError(t, err)
			var got []int
			for i := 0; i < 8; i++ {
				if _, ok := reqs[i]; ok {
					got = append(got, i)
				}
			}
			require.Equal(t, tc.gpus, got)
			if tc.check != nil {
				tc.check(t, reqs)
			}
			// every configuration selecting H200s plans
			_, err = mig.PlanNode(node, reqs, mig.PlanOptions{})
			require.NoError(t, err)
		})
	}
	// mixed on GPU 6: seven 1-slice compute instances in one 7g GPU instance
	reqs, _ := cfg.Requests("mixed", node)
	plan, err := mig.PlanNode(node, reqs, mig.PlanOptions{})
	require.NoError(t, err)
	require.Equal(t, "7g.141gb@0:8[1c+1c+1c+1c+1c+1c+1c]", plan.GPUs[6].Target.String())
}

func TestConfigSelectByUUID(t *testing.T) {
	node := node8(t)
	body := "version: v1\nmig-configs:\n  c:\n    - devices: [\"" + node.GPUs[3].UUID + "\"]\n      mig-enabled: true\n      mig-devices:\n        \"7g.141gb\": 1\n"
	cfg, err := mig.ParseConfig([]byte(body), "u.yaml")
	require.NoError(t, err)
	reqs, err := cfg.Requests("c", node)
	require.NoError(t, err)
	require.Len(t, reqs, 1)
	require.Equal(t, "7g.141gb=1", reqs[3].String())
}

func TestConfigErrorsNameTheLine(t *testing.T) {
	tests := []struct {
		name, body string
		want       []string
	}{
		{"version", "version: v2\nmig-configs: {}\n", []string{"f.yaml:1", "v1"}},
		{"top key", "version: v1\nmig-config: {}\n", []string{"f.yaml:2", "mig-config"}},
		{"entry key", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: true\n      migdevices: {}\n", []string{"f.yaml:6", "migdevices"}},
		{"no devices", "version: v1\nmig-configs:\n  a:\n    - mig-enabled: true\n", []string{"f.yaml:4", "no devices"}},
		{"bad count", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: true\n      mig-devices:\n        \"1g.18gb\": two\n", []string{"f.yaml:7", "1g.18gb", "count"}},
		// mig-parted decodes counts into int: "3" in quotes is refused there
		// and here, never read as 3
		{"quoted count", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: true\n      mig-devices:\n        \"1g.18gb\": \"3\"\n", []string{"f.yaml:7", "1g.18gb", `got "3" (a quoted string)`}},
		{"single-quoted count", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: true\n      mig-devices:\n        \"1g.18gb\": '3'\n", []string{"f.yaml:7", "without quotes"}},
		{"float count", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: true\n      mig-devices:\n        \"1g.18gb\": 3.0\n", []string{"f.yaml:7", "got 3.0"}},
		{"negative count", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: true\n      mig-devices:\n        \"1g.18gb\": -1\n", []string{"f.yaml:7", "non-negative"}},
		{"list count", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: true\n      mig-devices:\n        \"1g.18gb\": [3]\n", []string{"f.yaml:7", "got a list"}},
		{"quoted mig-enabled", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: \"true\"\n", []string{"f.yaml:5", "mig-enabled", `"true" (a quoted string)`}},
		{"numeric mig-enabled", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: 1\n", []string{"f.yaml:5", "mig-enabled must be true or false"}},
		{"quoted start", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: true\n      mig-devices:\n        \"1g.18gb\": 1\n      mig-placements:\n        \"1g.18gb\": [\"2\"]\n", []string{"f.yaml:9", "without quotes"}},
		{"bad profile", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: true\n      mig-devices:\n        \"1x.18gb\": 1\n", []string{"f.yaml:7", "1x.18gb"}},
		{"placement without device", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: true\n      mig-devices:\n        \"1g.18gb\": 1\n      mig-placements:\n        \"2g.35gb\": [0]\n", []string{"f.yaml:9", "not in mig-devices"}},
		{"start out of range", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: true\n      mig-devices:\n        \"1g.18gb\": 1\n      mig-placements:\n        \"1g.18gb\": [9]\n", []string{"f.yaml:9", "0..7"}},
		// mig-parted refuses both: a forgotten mig-devices would otherwise
		// destroy every instance
		{"mig-enabled without mig-devices", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: true\n", []string{"f.yaml:4", "needs mig-devices", "mig-devices: {}"}},
		{"mig-devices empty", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: true\n      mig-devices:\n", []string{"f.yaml:6", "needs mig-devices"}},
		{"devices disabled", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: false\n      mig-devices:\n        \"1g.18gb\": 1\n", []string{"f.yaml:7", "mig-enabled: false"}},
		{"filter", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      device-filter: H200\n      mig-enabled: false\n", []string{"f.yaml:5", "device-filter"}},
		{"malformed", "version: v1\nmig-configs:\n  a: [\n", []string{"f.yaml", "line"}},
		{"no entries", "version: v1\nmig-configs:\n  a: []\n", []string{"f.yaml:3", `"a" has no entries`}},
		{"no configurations", "version: v1\nmig-configs: {}\n", []string{"f.yaml:2", "no configurations"}},
		// YAML forbids a key twice in a mapping; taking the last one would
		// silently turn MIG off here
		{"entry key twice", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: true\n      mig-enabled: false\n", []string{"f.yaml:6", `"mig-enabled" given twice`, "line 5"}},
		{"devices twice", "version: v1\nmig-configs:\n  a:\n    - devices: [0]\n      devices: all\n      mig-enabled: false\n", []string{"f.yaml:5", `"devices" given twice`}},
		{"version twice", "version: v1\nversion: v1\nmig-configs: {}\n", []string{"f.yaml:2", `"version" given twice`}},
		{"merge of a scalar", "version: v1\nmig-configs:\n  a:\n    - <<: 3\n      devices: all\n      mig-enabled: false\n", []string{"f.yaml:4", "merge key"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := mig.ParseConfig([]byte(tc.body), "f.yaml")
			require.Error(t, err)
			require.True(t, errors.Is(err, mig.ErrBadConfig) || errors.Is(err, mig.ErrUnknownProfile), "%v", err)
			for _, w := range tc.want {
				require.Contains(t, err.Error(), w)
			}
		})
	}
}

// TestConfigAliasesAndMergeKeys: mig-parted reads its file with
// sigs.k8s.io/yaml, which resolves anchors, aliases and merge keys; a file
// that shares entries or mig-devices that way means the same to migctl.
func TestConfigAliasesAndMergeKeys(t *testing.T) {
	node := node8(t)
	const base = "version: v1\nmig-configs:\n  base:\n    - &e\n      devices: all\n      mig-enabled: true\n      mig-devices: &d {\"1g.18gb\": 7}\n"
	tests := []struct {
		name, body string
		gpus       []int  // the GPUs configuration b selects
		want       string // what it asks of each
	}{
		{"aliased mig-devices", base + "  b:\n    - devices: [1]\n      mig-enabled: true\n      mig-devices: *d\n", []int{1}, "1g.18gb=7"},
		{"aliased entry", base + "  b:\n    - *e\n", []int{0, 1, 2, 3, 4, 5, 6, 7}, "1g.18gb=7"},
		{"aliased configuration", "version: v1\nmig-configs:\n  base: &l\n    - devices: [2]\n      mig-enabled: true\n      mig-devices: {\"3g.71gb\": 2}\n  b: *l\n",
			[]int{2}, "3g.71gb=2"},
		{"merge key, own keys win", base + "  b:\n    - <<: *e\n      devices: [3]\n      mig-devices: {\"4g.71gb\": 1}\n", []int{3}, "4g.71gb=1"},
		{"merge list, earlier wins", base + "  b:\n    - <<: [{devices: [4]}, *e]\n", []int{4}, "1g.18gb=7"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := mig.ParseConfig([]byte(tc.body), "f.yaml")
			require.NoError(t, err)
			reqs, err := cfg.Requests("b", node)
			require.NoError(t, err)
			var got []int
			for i := 0; i < len(node.GPUs); i++ {
				if r, ok := reqs[i]; ok {
					got = append(got, i)
					require.Equal(t, tc.want, r.String(), "GPU %d", i)
				}
			}
			require.Equal(t, tc.gpus, got)
		})
	}
}

func TestConfigSelectionErrors(t *testing.T) {
	node := node8(t)
	tests := []struct {
		name, body string
		want       []string
	}{
		{"index out of range", "version: v1\nmig-configs:\n  a:\n    - devices: [1, 8]\n      mig-enabled: false\n", []string{"f.yaml:4", "device 8 out of range"}},
		{"unknown uuid", "version: v1\nmig-configs:\n  a:\n    - devices: [\"GPU-nope\"]\n      mig-enabled: false\n", []string{"f.yaml:4", "GPU-nope"}},
		{"selected twice", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: false\n    - devices: [2]\n      mig-enabled: false\n",
			[]string{"f.yaml:6: a: GPU 2 is already selected by the entry at f.yaml:4"}},
		{"selected twice, block list", "version: v1\nmig-configs:\n  a:\n    - devices:\n        - 1\n        - 2\n      mig-enabled: false\n    - devices:\n        - 3\n        - 2\n      mig-enabled: false\n",
			[]string{"f.yaml:10: a: GPU 2 is already selected by the entry at f.yaml:6"}},
		// the same GPU twice in one entry: the message points at the first
		// listing, not at the entry itself
		{"twice in one entry", "version: v1\nmig-configs:\n  a:\n    - devices:\n        - 2\n        - 2\n      mig-enabled: false\n",
			[]string{"f.yaml:6: a: GPU 2 is listed twice in this entry's devices (first at f.yaml:5"}},
		{"index and bus id in one entry", "version: v1\nmig-configs:\n  a:\n    - devices:\n        - 0\n        - \"0000:18:00.0\"\n      mig-enabled: false\n",
			[]string{"f.yaml:6: a: GPU 0 is listed twice in this entry's devices (first at f.yaml:5"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := mig.ParseConfig([]byte(tc.body), "f.yaml")
			require.NoError(t, err)
			_, err = cfg.Requests("a", node)
			require.ErrorIs(t, err, mig.ErrBadConfig)
			for _, w := range tc.want {
				require.Contains(t, err.Error(), w)
			}
		})
	}
}

func TestParseLayoutFlag(t *testing.T) {
	tests := []struct {
		in, out string
		ok      bool
	}{
		{"1g.18gb=2,3g.71gb=1", "1g.18gb=2,3g.71gb=1", true},
		{"3g.71gb@4, 1g.18gb=3", "3g.71gb@4,1g.18gb=3", true},
		{"2g.35gb@0,2g.35gb@2,2g.35gb=1", "2g.35gb=1,2g.35gb@0,2g.35gb@2", true},
		{"1c.2g.35gb=4", "1c.2g.35gb=4", true},
		{"none", "mig enabled, no instances", true},
		{"", "", false},
		{"1g.18gb=x", "", false},
		{"1g.18gb@8", "", false},
		{"bogus=1", "", false},
		{"1g.18gb=1,1g.18gb=2", "", false}, // two counts for one profile: a typo, not 3
		{"3g.71gb=1,3g.71gb@4", "3g.71gb=1,3g.71gb@4", true},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			r, err := mig.ParseLayout(tc.in)
			if !tc.ok {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			require.True(t, r.MIGEnabled)
			require.Equal(t, tc.out, r.String())
		})
	}
}

func TestSelectGPUs(t *testing.T) {
	node := node8(t)
	got, err := mig.SelectGPUs("3,1,"+node.GPUs[5].UUID+",0000:18:00.0", node)
	require.NoError(t, err)
	require.Equal(t, []int{0, 1, 3, 5}, got)
	got, err = mig.SelectGPUs("all", node)
	require.NoError(t, err)
	require.Len(t, got, 8)
	_, err = mig.SelectGPUs("8", node)
	require.ErrorIs(t, err, mig.ErrBadConfig)
	_, err = mig.SelectGPUs("GPU-missing", node)
	require.ErrorIs(t, err, mig.ErrBadConfig)
}

// TestSelectGPUsEmptyIsAnError: only "all" selects every GPU; an empty
// selection or an empty entry is a mistake, never "all".
func TestSelectGPUsEmptyIsAnError(t *testing.T) {
	node := node8(t)
	for _, s := range []string{"", "  ", ",", "0,,1", "0,"} {
		got, err := mig.SelectGPUs(s, node)
		require.ErrorIs(t, err, mig.ErrBadConfig, "--gpus %q", s)
		require.ErrorContains(t, err, "empty", "--gpus %q", s)
		require.ErrorContains(t, err, "'all'", "the error says how to select every GPU")
		require.Nil(t, got)
	}
}

// TestLayoutErrorsNameTheEntry: errors about a --layout entry quote the entry
// as typed, and an infeasible layout says what it adds up to.
func TestLayoutErrorsNameTheEntry(t *testing.T) {
	g := h200(t)
	tests := []struct {
		layout string
		want   []string
	}{
		{"1g.10gb=1", []string{`--layout entry "1g.10gb=1"`, "has no profile 1g.10gb"}},
		{"3g.71gb@2", []string{`--layout entry "3g.71gb@2"`, "cannot start at memory unit 2"}},
		{"1g.18gb=2,1g.18gb=1", []string{`--layout entry "1g.18gb=1"`, "already has a count"}},
		{"3g.71gb=2,1g.18gb=1", []string{`--layout entry "1g.18gb=1"`, "3g.71gb x2 + 1g.18gb need 9 memory units, the GPU has 8"}},
		{"4g.71gb=1,1g.18gb=4", []string{"4g.71gb + 1g.18gb x4 need 8 compute slices, the GPU has 7"}},
		{"1g.18gb@0,4g.71gb=1", []string{`cannot place 4g.71gb (--layout entry "4g.71gb=1")`, "starting at 0", "free memory units: 1-7", "placed: 1g.18gb@0:1"}},
	}
	for _, tc := range tests {
		t.Run(tc.layout, func(t *testing.T) {
			r, err := mig.ParseLayout(tc.layout)
			if err == nil {
				_, err = mig.PlanGPU(g, r, mig.PlanOptions{})
			}
			require.Error(t, err)
			for _, w := range tc.want {
				require.Contains(t, err.Error(), w)
			}
			require.NotContains(t, err.Error(), "placed: empty")
		})
	}
}

// TestReadConfigFileBounded: a layout file is read only when it is a regular
// file (or stdin) of at most 1 MiB; /dev/zero, a FIFO or a directory fail at
// once with a reason instead of reading without end or blocking.
func TestReadConfigFileBounded(t *testing.T) {
	dir := t.TempDir()
	small := filepath.Join(dir, "small.yaml")
	body := []byte("version: v1\n")
	require.NoError(t, os.WriteFile(small, body, 0o644))
	limit := filepath.Join(dir, "limit.yaml")
	require.NoError(t, os.WriteFile(limit, bytes.Repeat([]byte{'#'}, mig.MaxConfigBytes), 0o644))
	big := filepath.Join(dir, "big.yaml")
	require.NoError(t, os.WriteFile(big, bytes.Repeat([]byte{'#'}, mig.MaxConfigBytes+1), 0o644))
	fifo := filepath.Join(dir, "fifo")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))

	tests := []struct {
		name  string
		path  string
		stdin string
		want  string // error substring; "" = no error
	}{
		{"regular file", small, "", ""},
		{"exactly 1 MiB", limit, "", ""},
		{"over 1 MiB", big, "", "over the 1048576-byte (1 MiB) limit"},
		{"character device", "/dev/zero", "", "not a regular file (a character device)"},
		{"directory", dir, "", "not a regular file (a directory)"},
		{"named pipe", fifo, "", "not a regular file (a named pipe)"},
		{"missing", filepath.Join(dir, "nope.yaml"), "", "no such file"},
		{"stdin", "-", string(body), ""},
		{"stdin over 1 MiB", "-", strings.Repeat("#", mig.MaxConfigBytes+1), "more than 1048576 bytes"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			type result struct {
				data []byte
				err  error
			}
			done := make(chan result, 1)
			go func() {
				data, err := mig.ReadConfigFile(tc.path, strings.NewReader(tc.stdin))
				done <- result{data, err}
			}()
			var r result
			select {
			case r = <-done:
			case <-time.After(10 * time.Second):
				t.Fatalf("ReadConfigFile(%s) still running after 10s", tc.path)
			}
			if tc.want != "" {
				require.ErrorIs(t, r.err, mig.ErrBadConfig)
				require.ErrorContains(t, r.err, tc.want)
				require.Nil(t, r.data)
				return
			}
			require.NoError(t, r.err)
			require.LessOrEqual(t, len(r.data), mig.MaxConfigBytes)
			if tc.path == small || tc.path == "-" {
				require.Equal(t, body, r.data)
			}
		})
	}
}

// TestExportRoundTripsOrRefuses: Export writes a file that reproduces the
// layout when applied to a fresh node, or refuses: mig-parted counts pack
// compute instances into full GPU instances, so two GPU instances of one
// profile that are both partly filled have no spelling.
func TestExportRoundTripsOrRefuses(t *testing.T) {
	type gi struct {
		enum  int
		start uint32
		cis   int // 1-slice compute instances
	}
	tests := []struct {
		name    string
		gis     []gi
		wantErr string
	}{
		{"full and half 2g", []gi{{nvml.GPU_INSTANCE_PROFILE_2_SLICE, 0, 2}, {nvml.GPU_INSTANCE_PROFILE_2_SLICE, 2, 1}}, ""},
		{"half then full 3g", []gi{{nvml.GPU_INSTANCE_PROFILE_3_SLICE, 0, 1}, {nvml.GPU_INSTANCE_PROFILE_3_SLICE, 4, 3}}, ""},
		{"two half 2g", []gi{{nvml.GPU_INSTANCE_PROFILE_2_SLICE, 0, 1}, {nvml.GPU_INSTANCE_PROFILE_2_SLICE, 2, 1}}, "cannot express"},
		{"two partial 3g", []gi{{nvml.GPU_INSTANCE_PROFILE_3_SLICE, 0, 2}, {nvml.GPU_INSTANCE_PROFILE_3_SLICE, 4, 1}}, "cannot express"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sim := migsim.New(migsim.H200, 1)
			dev, ret := sim.DeviceGetHandleByIndex(0)
			require.Equal(t, nvml.SUCCESS, ret)
			_, ret = dev.SetMigMode(nvml.DEVICE_MIG_ENABLE)
			require.Equal(t, nvml.SUCCESS, ret)
			for _, g := range tc.gis {
				info, ret := dev.GetGpuInstanceProfileInfo(g.enum)
				require.Equal(t, nvml.SUCCESS, ret)
				pls, ret := dev.GetGpuInstancePossiblePlacements(&info)
				require.Equal(t, nvml.SUCCESS, ret)
				gpuInst, ret := dev.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: g.start, Size: pls[0].Size})
				require.Equal(t, nvml.SUCCESS, ret)
				ci, ret := gpuInst.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
				require.Equal(t, nvml.SUCCESS, ret)
				for k := 0; k < g.cis; k++ {
					_, ret = gpuInst.CreateComputeInstance(&ci)
					require.Equal(t, nvml.SUCCESS, ret)
				}
			}
			node, err := mig.Discover(sim)
			require.NoError(t, err)
			b, err := mig.Export(node, "current", nil)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			cfg, err := mig.ParseConfig(b, "export.yaml")
			require.NoError(t, err)
			fresh := migsim.New(migsim.H200, 1)
			fnode, err := mig.Discover(fresh)
			require.NoError(t, err)
			reqs, err := cfg.Requests("current", fnode)
			require.NoError(t, err)
			res, err := mig.NewManager(fresh).Apply(context.Background(), reqs, mig.ApplyOptions{})
			require.NoError(t, err)
			require.Equal(t, node.GPUs[0].Layout().String(), res.GPUs[0].Layout.String())
		})
	}
}
