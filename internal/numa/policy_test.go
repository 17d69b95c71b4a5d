package numa

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/internal/testutil"
)

func TestPlacer(t *testing.T) {
	// GPU 0 at bus 17 (node 0), GPU 4 at bus 9a (node 1), as NVML writes them.
	ids := map[int]string{0: "00000000:17:00.0", 4: "00000000:9A:00.0"}
	two := fakeSysfs(t)
	one := Sysfs(t.TempDir()) // no node directory: one node
	n0 := Placement{Node: 0, CPUs: list(t, "0-15,32-47")}
	n1 := Placement{Node: 1, CPUs: list(t, "16-31,48-63")}
	for _, tc := range []struct {
		desc string
		mode string
		sys  Sysfs
		ids  map[int]string
		gpus []int
		want []Placement // nil: no placer at all
	}{
		{"off", "off", two, ids, []int{0, 4}, nil},
		{"auto, one node", "auto", one, ids, []int{0, 4}, nil},
		{"no bus IDs", "on", two, nil, []int{0}, nil},
		{"auto, GPUs on two nodes: CPUs and memory", "auto", two, ids, []int{0, 0, 4, 4}, []Placement{n0, n0, n1, n1}},
		{"auto, GPUs on one node: memory only", "auto", two, ids, []int{0, 0}, []Placement{{Node: 0}, {Node: 0}}},
		{"on, one node's GPUs: CPUs too", "on", two, ids, []int{4}, []Placement{n1}},
		{"a GPU without a bus ID, and an unknown GPU", "on", two, ids, []int{0, 3, -1}, []Placement{n0, None, None}},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			place, err := Placer(tc.mode, tc.sys, tc.ids)
			require.NoError(t, err)
			if tc.want == nil {
				require.Nil(t, place)
				return
			}
			require.NotNil(t, place)
			require.Equal(t, tc.want, place(tc.gpus))
		})
	}
}

func TestPlacerRefusesAnUnknownMode(t *testing.T) {
	_, err := Placer("numa", fakeSysfs(t), map[int]string{0: "00000000:17:00.0"})
	require.ErrorContains(t, err, `unknown NUMA mode "numa": want auto, on, off`)
	require.NoError(t, CheckMode("auto"))
	require.Error(t, CheckMode(""))
}

func TestPlacerWithoutReadableNodes(t *testing.T) {
	sys := Sysfs(testutil.WriteTree(t, map[string]string{"devices/system/node/online": "zero"}))
	_, err := Placer("on", sys, map[int]string{0: "00000000:17:00.0"})
	require.ErrorContains(t, err, "reading the host's NUMA nodes")
}
