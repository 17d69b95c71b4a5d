package mig

import (
	"bytes"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Export writes the current layout of the given GPUs (all when gpus is nil)
// as a mig-parted v1 file with one configuration, name, and migctl's
// mig-placements so that applying it reproduces the layout exactly. GPUs
// with identical layouts share an entry ("devices: all" when that is every
// GPU of the node). A GPU instance holding compute instances of different
// sizes has no mig-parted spelling and is an error, and so are two GPU
// instances of one profile and compute-instance size that are both partly
// filled (a count packs compute instances into full GPU instances).
func Export(node *Node, name string, gpus []int) ([]byte, error) {
	return ExportWith(node, name, gpus, ExportOptions{})
}

// ExportOptions tune [ExportWith].
type ExportOptions struct {
	// MigParted writes strict mig-parted v1: no mig-placements (mig-parted
	// refuses keys it does not know), so mig-parted can apply the file; it
	// then chooses placements itself, and migctl's planner does when migctl
	// applies it.
	MigParted bool
}

// ExportWith is [Export] with options.
func ExportWith(node *Node, name string, gpus []int, opts ExportOptions) ([]byte, error) {
	if gpus == nil {
		for _, g := range node.GPUs {
			gpus = append(gpus, g.Index)
		}
	}
	type group struct {
		key     string
		gpus    []int
		enabled bool
		devices []DeviceRequest
	}
	var groups []*group
	for _, i := range gpus {
		if i < 0 || i >= len(node.GPUs) {
			return nil, fmt.Errorf("%w: device %d out of range", ErrBadConfig, i)
		}
		g := &node.GPUs[i]
		req, err := requestOf(g)
		if err != nil {
			return nil, err
		}
		key := g.Name + "|" + req.String()
		var grp *group
		for _, x := range groups {
			if x.key == key {
				grp = x
			}
		}
		if grp == nil {
			grp = &group{key: key, enabled: req.MIGEnabled, devices: req.Devices}
			groups = append(groups, grp)
		}
		grp.gpus = append(grp.gpus, i)
	}
	str := func(s string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Value: s} }
	qstr := func(s string) *yaml.Node {
		return &yaml.Node{Kind: yaml.ScalarNode, Value: s, Style: yaml.DoubleQuotedStyle}
	}
	num := func(n int) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.Itoa(n)} }
	var entries []*yaml.Node
	for _, grp := range groups {
		e := &yaml.Node{Kind: yaml.MappingNode}
		if len(groups) == 1 && len(grp.gpus) == len(node.GPUs) {
			e.Content = append(e.Content, str("devices"), str("all"))
		} else {
			seq := &yaml.Node{Kind: yaml.SequenceNode, Style: yaml.FlowStyle}
			for _, i := range grp.gpus {
				seq.Content = append(seq.Content, num(i))
			}
			e.Content = append(e.Content, str("devices"), seq)
		}
		e.Content = append(e.Content, str("mig-enabled"), &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: strconv.FormatBool(grp.enabled)})
		if grp.enabled {
			devs := &yaml.Node{Kind: yaml.MappingNode}
			pls := &yaml.Node{Kind: yaml.MappingNode}
			for _, d := range grp.devices {
				devs.Content = append(devs.Content, qstr(d.Profile), num(d.Count))
				seq := &yaml.Node{Kind: yaml.SequenceNode, Style: yaml.FlowStyle}
				for _, s := range d.Starts {
					seq.Content = append(seq.Content, num(s))
				}
				pls.Content = append(pls.Content, qstr(d.Profile), seq)
			}
			e.Content = append(e.Content, str("mig-devices"), devs)
			if len(pls.Content) > 0 && !opts.MigParted {
				e.Content = append(e.Content, str("mig-placements"), pls)
			}
		}
		entries = append(entries, e)
	}
	doc := &yaml.Node{Kind: yaml.MappingNode, Content: []*yaml.Node{
		str("version"), str("v1"),
		str("mig-configs"), {Kind: yaml.MappingNode, Content: []*yaml.Node{
			str(name), {Kind: yaml.SequenceNode, Content: entries},
		}},
	}}
	var buf bytes.Buffer
	if opts.MigParted {
		buf.WriteString("# written by migctl partition export --mig-parted: strict mig-parted v1, no placements\n")
	} else {
		buf.WriteString("# written by migctl partition export; mig-placements is migctl's extension to mig-parted v1\n")
		buf.WriteString("# (mig-parted refuses it: use 'migctl partition export --mig-parted' for a file mig-parted applies)\n")
	}
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(doc); err != nil {
		return nil, fmt.Errorf("encoding export: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("encoding export: %w", err)
	}
	return buf.Bytes(), nil
}

// requestOf is the request that reproduces g's current layout exactly.
func requestOf(g *GPU) (Request, error) {
	r := Request{MIGEnabled: g.MIGEnabled}
	if !g.MIGEnabled {
		return r, nil
	}
	type gi struct {
		start, cis int
	}
	byKey := map[string][]gi{}
	var order []string
	for _, in := range g.Instances {
		name, err := ParseProfileName(in.Profile)
		if err != nil {
			return r, err
		}
		sl := in.CISlices()
		c := name.G
		if len(sl) > 0 {
			c = sl[0]
			for _, x := range sl {
				if x != c {
					return r, fmt.Errorf("GPU %d: %s holds compute instances of different sizes %v, which mig-parted cannot express", g.Index, in, sl)
				}
			}
		}
		name.C = c
		key := name.String()
		if _, ok := byKey[key]; !ok {
			order = append(order, key)
		}
		n := len(sl)
		if n == 0 {
			n = 1 // an empty GI comes back with one full compute instance
		}
		byKey[key] = append(byKey[key], gi{start: in.Placement.Start, cis: n})
	}
	for _, key := range order {
		gis := byKey[key]
		// fuller GIs first: Expand packs compute instances into the first GIs
		sort.SliceStable(gis, func(a, b int) bool { return gis[a].cis > gis[b].cis })
		name, _ := ParseProfileName(key)
		per := CICapacity(name.G, name.ComputeSlices())
		for k, x := range gis[:len(gis)-1] {
			// a count packs: every GI but the last must be full, or the file
			// would ask for fewer GIs than there are
			if x.cis != per {
				return r, fmt.Errorf("GPU %d: the %s GPU instances at memory units %d and %d hold %d and %d compute instances of %d slices (a full one holds %d); mig-parted packs a count into full GPU instances, so it cannot express this",
					g.Index, name.GI(), x.start, gis[k+1].start, x.cis, gis[k+1].cis, name.ComputeSlices(), per)
			}
		}
		d := DeviceRequest{Profile: key}
		for _, x := range gis {
			d.Count += x.cis
			d.Starts = append(d.Starts, x.start)
		}
		r.Devices = append(r.Devices, d)
	}
	return r, nil
}

// RequestOf is the request that reproduces g's current layout (see Export).
func RequestOf(g *GPU) (Request, error) { return requestOf(g) }

// Assert checks that g matches req: MIG mode (current and pending), and for each requested profile
// the number of MIG devices and any pinned placements. It returns nil or an
// error wrapping ErrMismatch with a one-line reason.
func Assert(g *GPU, req Request) error {
	if req.MIGEnabled != g.MIGEnabled {
		return fmt.Errorf("%w: GPU %d: MIG mode is %s, want %s", ErrMismatch, g.Index, onOff(g.MIGEnabled), onOff(req.MIGEnabled))
	}
	if req.MIGEnabled != g.MIGPending {
		return fmt.Errorf("%w: GPU %d: MIG mode is %s but %s is pending (the next GPU reset applies it), want %s",
			ErrMismatch, g.Index, onOff(g.MIGEnabled), onOff(g.MIGPending), onOff(req.MIGEnabled))
	}
	if !req.MIGEnabled {
		return nil
	}
	wants, err := Expand(g, req)
	if err != nil {
		return err
	}
	want := map[string]int{}
	var pins []InstanceSpec
	for _, w := range wants {
		want[specKey(w.Profile.Name, w.CISlices)]++
		if w.Start >= 0 {
			pins = append(pins, w.spec(w.Start))
		}
	}
	have := map[string]int{}
	for _, in := range g.Instances {
		have[specKey(in.Profile, in.CISlices())]++
	}
	var diffs []string
	keys := map[string]bool{}
	for k := range want {
		keys[k] = true
	}
	for k := range have {
		keys[k] = true
	}
	sorted := make([]string, 0, len(keys))
	for k := range keys {
		sorted = append(sorted, k)
	}
	sort.Strings(sorted)
	for _, k := range sorted {
		if want[k] != have[k] {
			diffs = append(diffs, fmt.Sprintf("%s: have %d, want %d", k, have[k], want[k]))
		}
	}
	for _, p := range pins {
		found := false
		for _, in := range g.Instances {
			if in.Spec().Equal(p) {
				found = true
			}
		}
		if !found {
			diffs = append(diffs, fmt.Sprintf("no %s", p))
		}
	}
	if len(diffs) > 0 {
		return fmt.Errorf("%w: GPU %d: %s (current: %s)", ErrMismatch, g.Index, strings.Join(diffs, "; "), g.Layout())
	}
	return nil
}

func specKey(profile string, cis []int) string {
	cs := sortedInts(cis)
	parts := make([]string, len(cs))
	for i, c := range cs {
		parts[i] = strconv.Itoa(c) + "c"
	}
	return profile + "[" + strings.Join(parts, "+") + "]"
}

func onOff(b bool) string {
	if b {
		return "enabled"
	}
	return "disabled"
}
