package mig

import (
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"go.yaml.in/yaml/v3"
)

// Config is a mig-parted v1 configuration file, read as-is, with migctl's
// extensions: devices may name GPUs by UUID or PCI bus id as well as index,
// and an entry may pin GPU instances with "mig-placements".
//
//	version: v1
//	mig-configs:
//	  balanced:
//	    - devices: all              # or [0, 1], or ["GPU-…", "0000:1B:00.0"]
//	      device-filter: "0x233510DE" # optional: PCI device ids (string or list)
//	      mig-enabled: true
//	      mig-devices:
//	        "3g.71gb": 1
//	        "2g.35gb": 1
//	      mig-placements:           # migctl extension: memory-unit starts
//	        "3g.71gb": [4]
type Config struct {
	File    string
	Version string
	Configs map[string][]ConfigEntry
	order   []string
}

// ConfigEntry is one item of a named configuration.
type ConfigEntry struct {
	Line         int
	DevicesLine  int // line of the devices key's value
	AllDevices   bool
	Devices      []DeviceSelector
	DeviceFilter []uint32
	MIGEnabled   bool
	MIGDevices   []DeviceRequest // in file order
}

// DeviceSelector names one GPU: by index, or by UUID / PCI bus id (Key).
type DeviceSelector struct {
	Index int // -1 when Key is used
	Key   string
	Line  int
}

// Names lists the configurations in file order.
func (c *Config) Names() []string { return append([]string(nil), c.order...) }

func (c *Config) errf(n *yaml.Node, format string, args ...any) error {
	return fmt.Errorf("%w: %s:%d: %s", ErrBadConfig, c.File, n.Line, fmt.Sprintf(format, args...))
}

// MaxConfigBytes is the largest layout file ReadConfigFile reads. Real
// layout files are a few KiB; the cap keeps "-f /dev/zero" or a wrong
// multi-gigabyte file from exhausting memory.
const MaxConfigBytes = 1 << 20

// ReadConfigFile reads a layout file for [ParseConfig]: a regular file of at
// most MaxConfigBytes, or stdin when path is "-" (the same cap). Devices,
// FIFOs and directories are refused before anything is read: opening never
// blocks on a FIFO. Errors wrap ErrBadConfig and say what to give instead.
func ReadConfigFile(path string, stdin io.Reader) ([]byte, error) {
	if path == "-" {
		if stdin == nil {
			return nil, fmt.Errorf("%w: -f -: no standard input to read", ErrBadConfig)
		}
		return readCapped(stdin, "standard input")
	}
	// O_NONBLOCK: a FIFO opens at once (and is refused below) instead of
	// waiting for a writer; it changes nothing for regular files.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: reading layout: %v", ErrBadConfig, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("%w: reading layout: %v", ErrBadConfig, err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: %s is not a regular file (%s): give a layout file, or -f - to read standard input",
			ErrBadConfig, path, fileKind(st.Mode()))
	}
	if st.Size() > MaxConfigBytes {
		return nil, fmt.Errorf("%w: %s is %d bytes, over the %d-byte (1 MiB) limit for a layout file: is it the right file?",
			ErrBadConfig, path, st.Size(), MaxConfigBytes)
	}
	return readCapped(f, path) // the size may change under us: cap the read too
}

// readCapped reads r to its end, failing once it passes MaxConfigBytes.
func readCapped(r io.Reader, name string) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(r, MaxConfigBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%w: reading layout from %s: %v", ErrBadConfig, name, err)
	}
	if len(data) > MaxConfigBytes {
		return nil, fmt.Errorf("%w: %s holds more than %d bytes (1 MiB), the limit for a layout file: is it the right input?",
			ErrBadConfig, name, MaxConfigBytes)
	}
	return data, nil
}

func fileKind(m os.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&os.ModeCharDevice != 0:
		return "a character device"
	case m&os.ModeDevice != 0:
		return "a block device"
	case m&os.ModeNamedPipe != 0:
		return "a named pipe"
	case m&os.ModeSocket != 0:
		return "a socket"
	}
	return "mode " + m.String()
}

// ParseConfig parses a mig-parted v1 file; file names the source in errors,
// which carry line numbers and name the offending key.
func ParseConfig(data []byte, file string) (*Config, error) {
	c := &Config{File: file, Configs: map[string][]ConfigEntry{}}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrBadConfig, file, err)
	}
	if len(doc.Content) == 0 {
		return nil, fmt.Errorf("%w: %s: empty file", ErrBadConfig, file)
	}
	root := doc.Content[0]
	budget := maxMergedKeys
	if err := c.resolve(root, map[*yaml.Node]bool{}, &budget); err != nil {
		return nil, err
	}
	if root.Kind != yaml.MappingNode {
		return nil, c.errf(root, "top level must be a mapping with version and mig-configs")
	}
	var configs *yaml.Node
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		switch k.Value {
		case "version":
			c.Version = v.Value
		case "mig-configs":
			configs = v
		default:
			return nil, c.errf(k, "unknown key %q (want version, mig-configs)", k.Value)
		}
	}
	if c.Version != "v1" {
		return nil, c.errf(root, "version must be v1, got %q", c.Version)
	}
	if configs == nil || configs.Kind != yaml.MappingNode {
		return nil, c.errf(root, "mig-configs must be a mapping of configuration names")
	}
	if len(configs.Content) == 0 {
		return nil, c.errf(configs, "mig-configs has no configurations")
	}
	for i := 0; i+1 < len(configs.Content); i += 2 {
		k, v := configs.Content[i], configs.Content[i+1]
		if _, dup := c.Configs[k.Value]; dup {
			return nil, c.errf(k, "configuration %q defined twice", k.Value)
		}
		if v.Kind != yaml.SequenceNode {
			return nil, c.errf(v, "configuration %q must be a list of entries", k.Value)
		}
		if len(v.Content) == 0 {
			return nil, c.errf(k, "configuration %q has no entries (mig-parted needs at least one)", k.Value)
		}
		var entries []ConfigEntry
		for _, en := range v.Content {
			e, err := c.parseEntry(k.Value, en)
			if err != nil {
				return nil, err
			}
			entries = append(entries, e)
		}
		c.Configs[k.Value] = entries
		c.order = append(c.order, k.Value)
	}
	return c, nil
}

// maxMergedKeys bounds the key/value pairs merge keys may copy in one file,
// so a chain of merges cannot make a small file expand without end.
const maxMergedKeys = 1 << 16

// resolve rewrites the tree under n in place the way mig-parted's YAML
// reader (sigs.k8s.io/yaml) sees it: aliases ("*base") become the node they
// name, and merge keys ("<<: *base", "<<: [*a, *b]") copy the named
// mappings' keys that the mapping does not set itself. A key given twice in
// one mapping is refused (YAML forbids it; mig-parted would silently keep the
// last one, e.g. the second of two mig-enabled). Shared nodes are visited
// once; budget counts the pairs merges may still copy.
func (c *Config) resolve(n *yaml.Node, done map[*yaml.Node]bool, budget *int) error {
	if done[n] {
		return nil
	}
	done[n] = true
	for i, ch := range n.Content {
		for ch.Kind == yaml.AliasNode && ch.Alias != nil {
			ch = ch.Alias
		}
		n.Content[i] = ch
		if err := c.resolve(ch, done, budget); err != nil {
			return err
		}
	}
	if n.Kind != yaml.MappingNode {
		return nil
	}
	seen := map[string]*yaml.Node{}
	var own, merged []*yaml.Node
	hasMerge := false
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind == yaml.ScalarNode && k.Tag == "!!merge" {
			hasMerge = true
			srcs := []*yaml.Node{v}
			if v.Kind == yaml.SequenceNode {
				srcs = v.Content
			}
			for _, m := range srcs {
				if m.Kind != yaml.MappingNode {
					return c.errf(k, "merge key << takes a mapping or a list of mappings (e.g. <<: *base), got %s", yamlValue(m))
				}
				merged = append(merged, m.Content...)
			}
			continue
		}
		if prev, dup := seen[k.Value]; dup {
			return c.errf(k, "key %q given twice in one mapping (first at line %d)", k.Value, prev.Line)
		}
		seen[k.Value] = k
		own = append(own, k, v)
	}
	if !hasMerge {
		return nil
	}
	for i := 0; i+1 < len(merged); i += 2 {
		if _, set := seen[merged[i].Value]; set {
			continue // the mapping's own keys, then earlier merged mappings, win
		}
		if *budget--; *budget < 0 {
			return c.errf(n, "merge keys copy more than %d keys: is it the right file?", maxMergedKeys)
		}
		seen[merged[i].Value] = merged[i]
		own = append(own, merged[i], merged[i+1])
	}
	n.Content = own
	return nil
}

func (c *Config) parseEntry(name string, n *yaml.Node) (ConfigEntry, error) {
	e := ConfigEntry{Line: n.Line}
	if n.Kind != yaml.MappingNode {
		return e, c.errf(n, "%s: entry must be a mapping", name)
	}
	var devices, placements *yaml.Node
	seen := map[string]bool{}
	var migDevs *yaml.Node
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		seen[k.Value] = true
		switch k.Value {
		case "devices":
			devices = v
		case "device-filter":
			f, err := c.parseFilter(name, v)
			if err != nil {
				return e, err
			}
			e.DeviceFilter = f
		case "mig-enabled":
			// a YAML boolean, as mig-parted (which decodes into a bool)
			// requires: not "true" in quotes, not 1
			b, err := strconv.ParseBool(v.Value)
			if err != nil || v.Kind != yaml.ScalarNode || v.Tag != "!!bool" {
				return e, c.errf(v, "%s: mig-enabled must be true or false (unquoted), got %s", name, yamlValue(v))
			}
			e.MIGEnabled = b
		case "mig-devices":
			migDevs = v
		case "mig-placements":
			placements = v
		default:
			return e, c.errf(k, "%s: unknown key %q (want devices, device-filter, mig-enabled, mig-devices, mig-placements)", name, k.Value)
		}
	}
	if devices == nil {
		return e, c.errf(n, "%s: entry has no devices", name)
	}
	if !seen["mig-enabled"] {
		return e, c.errf(n, "%s: entry has no mig-enabled", name)
	}
	e.DevicesLine = devices.Line
	switch {
	case devices.Kind == yaml.ScalarNode && devices.Value == "all":
		e.AllDevices = true
	case devices.Kind == yaml.SequenceNode:
		for _, d := range devices.Content {
			if d.Kind != yaml.ScalarNode {
				return e, c.errf(d, "%s: devices: each device is an index, a GPU UUID or a PCI bus id", name)
			}
			if i, err := strconv.Atoi(d.Value); err == nil && d.Tag == "!!int" {
				if i < 0 {
					return e, c.errf(d, "%s: devices: negative index %d", name, i)
				}
				e.Devices = append(e.Devices, DeviceSelector{Index: i, Line: d.Line})
			} else {
				e.Devices = append(e.Devices, DeviceSelector{Index: -1, Key: d.Value, Line: d.Line})
			}
		}
	default:
		return e, c.errf(devices, "%s: devices must be \"all\" or a list", name)
	}
	noDevs := migDevs == nil || (migDevs.Kind == yaml.ScalarNode && migDevs.Tag == "!!null")
	if !noDevs && migDevs.Kind != yaml.MappingNode {
		return e, c.errf(migDevs, "%s: mig-devices must map profile names to counts", name)
	}
	if e.MIGEnabled && noDevs {
		// as mig-parted: a forgotten (or empty) mig-devices must not mean
		// "destroy every instance"; {} says that on purpose
		at := n
		if migDevs != nil {
			at = migDevs
		}
		return e, c.errf(at, "%s: mig-enabled: true needs mig-devices (as mig-parted requires); "+
			"write mig-devices: {} for MIG on with no instances", name)
	}
	if migDevs != nil && migDevs.Kind == yaml.MappingNode {
		if !e.MIGEnabled && len(migDevs.Content) > 0 {
			return e, c.errf(migDevs, "%s: mig-devices given with mig-enabled: false", name)
		}
		for i := 0; i+1 < len(migDevs.Content); i += 2 {
			k, v := migDevs.Content[i], migDevs.Content[i+1]
			src := fmt.Sprintf("%s:%d: mig-devices %q", c.File, k.Line, k.Value)
			if _, err := ParseProfileName(k.Value); err != nil {
				return e, fmt.Errorf("%s: %w", src, err)
			}
			// an unquoted YAML integer: mig-parted decodes counts into
			// int and refuses "3" in quotes, so migctl does too
			cnt, err := strconv.Atoi(v.Value)
			if err != nil || v.Kind != yaml.ScalarNode || v.Tag != "!!int" || cnt < 0 {
				return e, c.errf(v, "%s: mig-devices %q: count must be a non-negative integer without quotes (as mig-parted requires), got %s",
					name, k.Value, yamlValue(v))
			}
			for _, d := range e.MIGDevices {
				if d.Profile == k.Value {
					return e, c.errf(k, "%s: mig-devices %q listed twice", name, k.Value)
				}
			}
			e.MIGDevices = append(e.MIGDevices, DeviceRequest{Profile: k.Value, Count: cnt, Source: src})
		}
	}
	if placements != nil {
		if placements.Kind != yaml.MappingNode {
			return e, c.errf(placements, "%s: mig-placements must map profile names to lists of starts", name)
		}
		for i := 0; i+1 < len(placements.Content); i += 2 {
			k, v := placements.Content[i], placements.Content[i+1]
			idx := -1
			for j, d := range e.MIGDevices {
				if d.Profile == k.Value {
					idx = j
				}
			}
			if idx < 0 {
				return e, c.errf(k, "%s: mig-placements %q: profile not in mig-devices", name, k.Value)
			}
			var starts []int
			items := v.Content
			if v.Kind == yaml.ScalarNode {
				items = []*yaml.Node{v}
			}
			for _, s := range items {
				st, err := strconv.Atoi(s.Value)
				if err != nil || s.Kind != yaml.ScalarNode || s.Tag != "!!int" || st < 0 || st >= MemoryUnits {
					return e, c.errf(s, "%s: mig-placements %q: start must be an integer 0..%d without quotes, got %s",
						name, k.Value, MemoryUnits-1, yamlValue(s))
				}
				starts = append(starts, st)
			}
			e.MIGDevices[idx].Starts = starts
			e.MIGDevices[idx].Source = fmt.Sprintf("%s:%d: mig-devices %q", c.File, k.Line, k.Value)
		}
	}
	return e, nil
}

// yamlValue shows a scalar as written: quoted when the file quoted it, so
// an error about "3" in quotes shows the quotes.
func yamlValue(n *yaml.Node) string {
	switch {
	case n.Kind != yaml.ScalarNode:
		return "a " + map[yaml.Kind]string{yaml.SequenceNode: "list", yaml.MappingNode: "mapping", yaml.AliasNode: "alias"}[n.Kind]
	case n.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle) != 0:
		return strconv.Quote(n.Value) + " (a quoted string)"
	}
	return n.Value
}

func (c *Config) parseFilter(name string, v *yaml.Node) ([]uint32, error) {
	items := []*yaml.Node{v}
	if v.Kind == yaml.SequenceNode {
		items = v.Content
	}
	var out []uint32
	for _, it := range items {
		for _, s := range strings.Split(it.Value, ",") {
			s = strings.TrimSpace(s)
			x, err := strconv.ParseUint(strings.TrimPrefix(strings.ToLower(s), "0x"), 16, 32)
			if err != nil || s == "" {
				return nil, c.errf(it, "%s: device-filter: %q is not a PCI device id like 0x233510DE", name, s)
			}
			out = append(out, uint32(x))
		}
	}
	return out, nil
}

// Requests resolves configuration name against the node: which GPUs each
// entry selects and what it asks of them. GPUs no entry selects are absent
// from the result (left alone). Errors name the entry and line: an unknown
// configuration, a device index out of range, a UUID or bus id that matches
// no GPU, a GPU selected by two entries.
func (c *Config) Requests(name string, node *Node) (map[int]Request, error) {
	entries, ok := c.Configs[name]
	if !ok {
		return nil, fmt.Errorf("%w: %s: no configuration %q (have: %s)", ErrBadConfig, c.File, name, strings.Join(c.order, ", "))
	}
	out := map[int]Request{}
	type selected struct{ gpu, line int }
	type origin struct{ entry, line int }
	by := map[int]origin{} // gpu -> the entry (index) and line that selected it
	for ei, e := range entries {
		var sel []selected
		if e.AllDevices {
			for _, g := range node.GPUs {
				sel = append(sel, selected{g.Index, e.DevicesLine})
			}
		}
		for _, d := range e.Devices {
			if d.Index >= 0 {
				if d.Index >= len(node.GPUs) {
					return nil, fmt.Errorf("%w: %s:%d: %s: device %d out of range (the node has %d GPUs: 0..%d)",
						ErrBadConfig, c.File, d.Line, name, d.Index, len(node.GPUs), len(node.GPUs)-1)
				}
				sel = append(sel, selected{d.Index, d.Line})
				continue
			}
			i, ok := node.Find(d.Key)
			if !ok {
				return nil, fmt.Errorf("%w: %s:%d: %s: device %q matches no GPU's UUID or PCI bus id", ErrBadConfig, c.File, d.Line, name, d.Key)
			}
			sel = append(sel, selected{i, d.Line})
		}
		for _, s := range sel {
			i := s.gpu
			if len(e.DeviceFilter) > 0 && !containsID(e.DeviceFilter, node.GPUs[i].PCIDeviceID) {
				continue
			}
			if prev, dup := by[i]; dup {
				if prev.entry == ei {
					return nil, fmt.Errorf("%w: %s:%d: %s: GPU %d is listed twice in this entry's devices (first at %s:%d, perhaps by index and by UUID or bus id): list it once",
						ErrBadConfig, c.File, s.line, name, i, c.File, prev.line)
				}
				return nil, fmt.Errorf("%w: %s:%d: %s: GPU %d is already selected by the entry at %s:%d: a GPU may be in one entry only",
					ErrBadConfig, c.File, s.line, name, i, c.File, prev.line)
			}
			by[i] = origin{ei, s.line}
			out[i] = Request{MIGEnabled: e.MIGEnabled, Devices: append([]DeviceRequest(nil), e.MIGDevices...)}
		}
	}
	return out, nil
}

func containsID(ids []uint32, id uint32) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

// Find returns the index of the GPU whose UUID or PCI bus id is key. Bus ids
// match in any common spelling ("0000:1b:00.0", "00000000:1B:00.0", "1b:00.0").
func (n *Node) Find(key string) (int, bool) {
	for _, g := range n.GPUs {
		if strings.EqualFold(g.UUID, key) || (g.PCIBusID != "" && sameBusID(g.PCIBusID, key)) {
			return g.Index, true
		}
	}
	return 0, false
}

func sameBusID(a, b string) bool {
	pa, ok1 := parseBusID(a)
	pb, ok2 := parseBusID(b)
	return ok1 && ok2 && pa == pb
}

func parseBusID(s string) ([4]uint64, bool) {
	s = strings.ToLower(strings.TrimSpace(s))
	var out [4]uint64
	parts := strings.Split(s, ":")
	if len(parts) == 2 {
		parts = append([]string{"0"}, parts...)
	}
	if len(parts) != 3 {
		return out, false
	}
	df := strings.Split(parts[2], ".")
	if len(df) != 2 {
		return out, false
	}
	for i, p := range []string{parts[0], parts[1], df[0], df[1]} {
		x, err := strconv.ParseUint(p, 16, 32)
		if err != nil {
			return out, false
		}
		out[i] = x
	}
	return out, true
}

// ParseLayout parses the --layout shorthand: comma-separated entries
// "PROFILE=COUNT" (the planner places them) or "PROFILE@START" (one instance
// pinned at a memory-unit start). "none" asks for MIG enabled with no
// instances. The result always has MIG enabled.
func ParseLayout(s string) (Request, error) {
	r := Request{MIGEnabled: true}
	s = strings.TrimSpace(s)
	if s == "" {
		return r, fmt.Errorf("%w: --layout is empty (use e.g. 1g.18gb=2,3g.71gb=1, or none)", ErrBadConfig)
	}
	if s == "none" {
		return r, nil
	}
	idx := map[string]int{}
	counted := map[string]string{} // profile -> its PROFILE=COUNT entry
	entries := map[string][]string{}
	for _, ent := range strings.Split(s, ",") {
		ent = strings.TrimSpace(ent)
		src := fmt.Sprintf("--layout entry %q", ent)
		prof, count, start := ent, 1, -1
		if p, c, ok := strings.Cut(ent, "="); ok {
			n, err := strconv.Atoi(strings.TrimSpace(c))
			if err != nil || n < 0 {
				return r, fmt.Errorf("%w: %s: count must be a non-negative integer", ErrBadConfig, src)
			}
			prof, count = strings.TrimSpace(p), n
		} else if p, st, ok := strings.Cut(ent, "@"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(st))
			if err != nil || n < 0 || n >= MemoryUnits {
				return r, fmt.Errorf("%w: %s: start must be 0..%d", ErrBadConfig, src, MemoryUnits-1)
			}
			prof, start = strings.TrimSpace(p), n
		}
		if _, err := ParseProfileName(prof); err != nil {
			return r, fmt.Errorf("%s: %w", src, err)
		}
		if start < 0 {
			if prev, dup := counted[prof]; dup {
				return r, fmt.Errorf("%w: %s: %s already has a count (%q); give each profile one PROFILE=COUNT", ErrBadConfig, src, prof, prev)
			}
			counted[prof] = ent
		}
		entries[prof] = append(entries[prof], ent)
		i, ok := idx[prof]
		if !ok {
			i = len(r.Devices)
			idx[prof] = i
			r.Devices = append(r.Devices, DeviceRequest{Profile: prof})
		}
		if e := entries[prof]; len(e) == 1 {
			r.Devices[i].Source = fmt.Sprintf("--layout entry %q", e[0])
		} else {
			r.Devices[i].Source = fmt.Sprintf("--layout entries %q", strings.Join(e, ","))
		}
		r.Devices[i].Count += count
		if start >= 0 {
			r.Devices[i].Starts = append(r.Devices[i].Starts, start)
		}
	}
	return r, nil
}

// SelectGPUs parses --gpus: "all", or comma-separated indices, UUIDs or PCI
// bus ids. An empty selection (or an empty entry) is an error: only "all"
// means every GPU. Errors name the entry and the node's range.
func SelectGPUs(s string, node *Node) ([]int, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, fmt.Errorf("%w: --gpus is empty: give 'all' or GPU indices, UUIDs or PCI bus ids, comma-separated", ErrBadConfig)
	}
	if s == "all" {
		out := make([]int, len(node.GPUs))
		for i := range node.GPUs {
			out[i] = node.GPUs[i].Index
		}
		return out, nil
	}
	seen := map[int]bool{}
	var out []int
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			return nil, fmt.Errorf("%w: --gpus %q: empty entry: give 'all' or GPU indices, UUIDs or PCI bus ids, comma-separated", ErrBadConfig, s)
		}
		i, err := strconv.Atoi(p)
		if err == nil {
			if i < 0 || i >= len(node.GPUs) {
				return nil, fmt.Errorf("%w: --gpus %q: device %d out of range (the node has %d GPUs: 0..%d)", ErrBadConfig, s, i, len(node.GPUs), len(node.GPUs)-1)
			}
		} else if i, err = findOrErr(node, p); err != nil {
			return nil, fmt.Errorf("%w: --gpus %q: %v", ErrBadConfig, s, err)
		}
		if !seen[i] {
			seen[i] = true
			out = append(out, i)
		}
	}
	sort.Ints(out)
	return out, nil
}

func findOrErr(node *Node, key string) (int, error) {
	if i, ok := node.Find(key); ok {
		return i, nil
	}
	return 0, fmt.Errorf("%q matches no GPU's index, UUID or PCI bus id", key)
}
