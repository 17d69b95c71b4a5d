package shimtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// PTX slicing (shim/ptxslice.c, issue 10 item 3): the rewriter on the repo's
// own PTX and on hand-written samples (testdata/ptxslice), slice plans, PTX in
// fatbins, and sliced launches on the fake driver.

func sliceProg(t *testing.T) string {
	t.Helper()
	needBin(t)
	p := filepath.Join(binDir, "migswap_ptxslicetest")
	_, err := os.Stat(p)
	require.NoError(t, err, "MIGSWAP_BIN=%s lacks migswap_ptxslicetest", binDir)
	return p
}

func runLines(t *testing.T, env []string, prog string, args ...string) []string {
	t.Helper()
	cmd := exec.Command(prog, args...)
	if env != nil {
		cmd.Env = env
	}
	out, err := cmd.Output()
	if ee, ok := err.(*exec.ExitError); ok {
		require.NoError(t, err, "%s %v: %s\n%s", prog, args, out, ee.Stderr)
	}
	require.NoError(t, err, "%s %v: %s", prog, args, out)
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}

func repoRoot(t *testing.T) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

type rewritten struct {
	module  map[string]string
	entries map[string]map[string]string
	in, out string // the PTX before and after ("" when nothing was rewritten)
}

func rewrite(t *testing.T, path string) rewritten {
	t.Helper()
	prog := sliceProg(t)
	out := filepath.Join(t.TempDir(), "out.ptx")
	lines := runLines(t, nil, prog, "rewrite", path, out)
	r := rewritten{entries: map[string]map[string]string{}}
	for _, l := range lines {
		switch {
		case strings.HasPrefix(l, "MODULE "):
			r.module = parseKV(l)
		case strings.HasPrefix(l, "ENTRY "):
			kv := parseKV(l)
			r.entries[kv["name"]] = kv
		}
	}
	in, err := os.ReadFile(path)
	require.NoError(t, err)
	r.in = string(in)
	if b, err := os.ReadFile(out); err == nil {
		r.out = string(b)
	}
	return r
}

const slicePrologue = "// migswap slicing: block offset and original grid from __ms_slice\n" +
	"\tld.param.u32 \t%__ms_ox, [__ms_slice];\n" +
	"\tld.param.u32 \t%__ms_oy, [__ms_slice+4];\n" +
	"\tld.param.u32 \t%__ms_oz, [__ms_slice+8];\n" +
	"\tld.param.u32 \t%__ms_nctaid_x, [__ms_slice+12];\n" +
	"\tld.param.u32 \t%__ms_nctaid_y, [__ms_slice+16];\n" +
	"\tld.param.u32 \t%__ms_nctaid_z, [__ms_slice+20];\n" +
	"\tmov.u32 \t%__ms_ctaid_x, %ctaid.x;\n" +
	"\tadd.u32 \t%__ms_ctaid_x, %__ms_ctaid_x, %__ms_ox;\n" +
	"\tmov.u32 \t%__ms_ctaid_y, %ctaid.y;\n" +
	"\tadd.u32 \t%__ms_ctaid_y, %__ms_ctaid_y, %__ms_oy;\n" +
	"\tmov.u32 \t%__ms_ctaid_z, %ctaid.z;\n" +
	"\tadd.u32 \t%__ms_ctaid_z, %__ms_ctaid_z, %__ms_oz;\n" +
	"\t// migswap slicing: end\n\t"

const sliceRegs = "\n\t.reg .b32 \t%__ms_ox, %__ms_oy, %__ms_oz, %__ms_ctaid_x, %__ms_ctaid_y, %__ms_ctaid_z, " +
	"%__ms_nctaid_x, %__ms_nctaid_y, %__ms_nctaid_z;"

var (
	vecAdjust = regexp.MustCompile(`\n\t(@!?%\w+)? (add\.u32 \t(\S+), (\S+), %__ms_o[xyz]|mov\.u32 \t\S+, %__ms_nctaid_[xyz]);`)
	legacy16  = regexp.MustCompile(`cvt\.u16\.u32(\s+[^,;]+, %__ms_n?ctaid_)`)
	gridToken = regexp.MustCompile(`%n?ctaid\b`)
	comments  = regexp.MustCompile(`(?s)//[^\n]*|/\*.*?\*/`)
	entryName = regexp.MustCompile(`\.entry\s+(\w+)`)
)

// unrewrite undoes exactly what the rewriter adds: the slice parameter, the
// register declarations, the prologue, the adjustments after vector reads and
// the register renames. What is left must be the original, byte for byte:
// nothing else changed, and every read the rewriter touched is accounted for.
func unrewrite(out string) string {
	s := out
	s = strings.ReplaceAll(s, ",\n\t.param .align 4 .b8 __ms_slice[24]", "")
	s = strings.ReplaceAll(s, "(.param .align 4 .b8 __ms_slice[24])", "")
	s = strings.ReplaceAll(s, "\n\t.param .align 4 .b8 __ms_slice[24]\n", "")
	s = strings.ReplaceAll(s, sliceRegs, "")
	s = strings.ReplaceAll(s, slicePrologue, "")
	s = vecAdjust.ReplaceAllString(s, "")
	s = legacy16.ReplaceAllString(s, "mov.u16$1")
	for _, c := range []string{"x", "y", "z"} {
		s = strings.ReplaceAll(s, "%__ms_ctaid_"+c, "%ctaid."+c)
		s = strings.ReplaceAll(s, "%__ms_nctaid_"+c, "%nctaid."+c)
	}
	return s
}

// checkStructure checks the rewritten PTX of every sliceable entry: it takes
// the slice parameter last, and reads %ctaid/%nctaid only in the prologue or
// in a vector read followed by its adjustments. Entries left unsliced are
// unchanged.
func checkStructure(t *testing.T, r rewritten) {
	t.Helper()
	require.NotEmpty(t, r.out, "nothing was rewritten: %v", r.module)
	require.Equal(t, r.in, unrewrite(r.out), "the rewrite changed more than the slice parameter, prologue and grid reads")
	text := comments.ReplaceAllString(r.out, "")
	text = strings.ReplaceAll(text, strings.ReplaceAll(comments.ReplaceAllString(slicePrologue, ""), "\n\t\n", "\n"), "")
	locs := entryName.FindAllStringSubmatchIndex(text, -1)
	for i, loc := range locs {
		name := text[loc[2]:loc[3]]
		end := len(text)
		if i+1 < len(locs) {
			end = locs[i+1][0]
		}
		body := text[loc[0]:end]
		e := r.entries[name]
		require.NotNil(t, e, "entry %s not reported", name)
		if e["sliceable"] != "1" {
			require.NotContains(t, body, "__ms_", "unsliced entry %s was changed", name)
			continue
		}
		params := body[:strings.Index(body, ")")]
		require.True(t, strings.HasSuffix(strings.TrimSpace(params), ".param .align 4 .b8 __ms_slice[24]"),
			"%s: the slice parameter is not last:\n%s", name, params)
		// every remaining raw read is a vector read whose components are adjusted next
		lines := strings.Split(body, "\n")
		for j, l := range lines {
			if l = strings.TrimSpace(l); l == "" || !gridToken.MatchString(l) {
				continue
			}
			if regexp.MustCompile(`^mov\.u32\s+%__ms_ctaid_[xyz], %ctaid\.[xyz];$`).MatchString(l) {
				continue
			}
			m := regexp.MustCompile(`^(@!?%\w+ )?mov\.v([24])\.[usb]32\s+\{([^}]*)\}, (%n?ctaid);$`).FindStringSubmatch(l)
			require.NotNil(t, m, "%s: raw read left unadjusted: %q", name, l)
			n, _ := strconv.Atoi(m[2])
			dst := strings.Split(m[3], ",")
			for c := 0; c < n && c < 3; c++ {
				d := strings.TrimSpace(dst[c])
				adj := strings.TrimSpace(lines[j+1+c])
				if m[4] == "%ctaid" {
					require.Equal(t, strings.TrimSpace(m[1]+" add.u32 \t"+d+", "+d+", %__ms_o"+"xyz"[c:c+1]+";"), adj)
				} else {
					require.Equal(t, strings.TrimSpace(m[1]+" mov.u32 \t"+d+", %__ms_nctaid_"+"xyz"[c:c+1]+";"), adj)
				}
			}
		}
	}
}

func TestPTXSliceRewritesRepoKernels(t *testing.T) {
	r := rewrite(t, filepath.Join(repoRoot(t), "allreduce", "kernels", "reduce.ptx"))
	require.Equal(t, "1", r.module["ok"])
	require.Equal(t, "29", r.module["nentries"], "7 types x (3 reductions + scale) + the copy kernel")
	require.Equal(t, "29", r.module["nsliceable"], "every kernel is sliceable: %v", r.entries)
	for name, e := range r.entries {
		if name == "mig_copy" {
			// (void *dst, const void *src, u64 n): writes dst, never reads it
			require.Equal(t, "3", e["nparams"], name)
			require.Equal(t, "24", e["param_bytes"], name)
			require.Equal(t, e["param_bytes"], e["slice_offset"], name)
			require.Equal(t, "1", e["sliceable"], name)
			require.NotEqual(t, "0", e["ctaid"], "%s: grid-stride loops read blockIdx.x", name)
			// (Whether it is idempotent is left to the slicer, which may
			// stay conservative: not re-running a kernel is always safe.)
			continue
		}
		if strings.HasPrefix(name, "mig_reduce_") {
			// (void *dst, Srcs{8 pointers}, int k, u64 n): 8 + 64 + 4 (+4 padding) + 8
			require.Equal(t, "4", e["nparams"], name)
			require.Equal(t, "88", e["param_bytes"], name)
		} else {
			require.Equal(t, "3", e["nparams"], name)
			require.Equal(t, "24", e["param_bytes"], name)
		}
		require.Equal(t, e["param_bytes"], e["slice_offset"], name)
		// dst = op(dst, srcs): no reduction kernel can be re-run from scratch
		require.Equal(t, "0", e["idempotent"], name)
		require.Contains(t, e["idem_reason"], "reads and writes the memory of parameter 0", name)
		require.NotEqual(t, "0", e["ctaid"], "%s: grid-stride loops read blockIdx.x", name)
		require.NotEqual(t, "0", e["nctaid"], "%s: and gridDim.x", name)
	}
	checkStructure(t, r)
}

func TestPTXSliceRewritesSamples(t *testing.T) {
	type want struct {
		sliceable                    bool
		nparams, paramBytes, sliceAt int
		ctaid, nctaid                int
		reason                       string
	}
	dir := filepath.Join("testdata", "ptxslice")
	for _, tc := range []struct {
		desc, file string
		entries    map[string]want
	}{
		{"3D probe and a grid-stride loop", "grid3d.ptx", map[string]want{
			"probe_mov": {true, 1, 8, 8, 3, 3, ""},
			"stride_1d": {true, 2, 16, 16, 1, 1, ""},
		}},
		{"vector reads of %ctaid and %nctaid", "vector.ptx", map[string]want{
			"probe_vec": {true, 1, 8, 8, 1, 1, ""},
		}},
		{"legacy 16-bit reads become cvt.u16.u32", "legacy16.ptx", map[string]want{
			"probe_16": {true, 1, 8, 8, 3, 3, ""},
		}},
		{"a grid register as an operand of add", "operand.ptx", map[string]want{
			"probe_op": {true, 1, 8, 8, 3, 3, ""},
		}},
		{"predicates, cvt, .loc, comments, a nested scope", "misc.ptx", map[string]want{
			"probe_misc": {true, 1, 8, 8, 3, 3, ""},
		}},
		{"parameter layouts", "params.ptx", map[string]want{
			// u8 @0, u64 @8, 12-byte struct aligned 8 @16, u32 @28
			"probe_params": {true, 4, 32, 32, 3, 3, ""},
			"noparams":     {true, 0, 0, 0, 0, 0, ""},
			// u64, u8: 9 bytes, the slice parameter 4-aligned at 12
			"tail_u8": {true, 2, 9, 12, 0, 0, ""},
		}},
		{"the GPU check's kernels, hand-written", "slicekern.ptx", map[string]want{
			"grid_probe": {true, 3, 20, 20, 3, 3, ""},
			"spin":       {true, 2, 16, 16, 1, 1, ""},
			"tiny":       {true, 1, 8, 8, 0, 0, ""},
		}},
		{"an entry without a parameter list", "noparens.ptx", map[string]want{
			"noparens": {true, 0, 0, 0, 1, 0, ""},
		}},
		{"kernels that must stay unsliced", "refused.ptx", map[string]want{
			"calls_ctaid_func":      {false, 1, 8, 8, 0, 0, "calls block_of, which reads %ctaid"},
			"calls_ctaid_func_deep": {false, 1, 8, 8, 0, 0, "calls wraps_block_of, which calls block_of"},
			"calls_tid_func":        {true, 1, 8, 8, 1, 0, ""},
			"prints":                {true, 1, 8, 8, 1, 0, ""},
			"cluster_reader":        {false, 1, 8, 8, 0, 0, "%clusterid"},
			"cluster_declared":      {false, 1, 8, 8, 0, 0, ".reqnctapercluster"},
			"reads_gridid":          {false, 1, 8, 8, 0, 0, "%gridid"},
			"reads_envreg":          {false, 1, 8, 8, 0, 0, "%envreg"},
			"device_launch":         {false, 1, 8, 8, 0, 0, "dynamic parallelism"},
			"calls_library":         {false, 1, 8, 8, 0, 0, "external some_library_fn"},
			"indirect_call":         {false, 1, 8, 8, 0, 0, "indirect call"},
			"wide_read":             {false, 1, 8, 8, 0, 0, "unsupported read of %ctaid: mov.u64"},
			"bad_component":         {false, 1, 8, 8, 0, 0, "%ctaid.w"},
			"too_many_params":       {false, 1, 4080, 4080, 0, 0, "no room for the slice parameter"},
		}},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			r := rewrite(t, filepath.Join(dir, tc.file))
			require.Equal(t, "1", r.module["ok"], "%v", r.module)
			require.Len(t, r.entries, len(tc.entries))
			for name, w := range tc.entries {
				e := r.entries[name]
				require.NotNil(t, e, "entry %s", name)
				require.Equal(t, w.sliceable, e["sliceable"] == "1", "%s: %v", name, e)
				require.Equal(t, strconv.Itoa(w.nparams), e["nparams"], name)
				require.Equal(t, strconv.Itoa(w.paramBytes), e["param_bytes"], name)
				require.Equal(t, strconv.Itoa(w.sliceAt), e["slice_offset"], name)
				if w.sliceable {
					require.Equal(t, strconv.Itoa(w.ctaid), e["ctaid"], name)
					require.Equal(t, strconv.Itoa(w.nctaid), e["nctaid"], name)
					require.Empty(t, e["reason"], name)
				} else {
					require.Contains(t, e["reason"], w.reason, name)
				}
			}
			checkStructure(t, r)
		})
	}
}

func TestPTXSliceRefusesModules(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ desc, ptx, reason string }{
		{"already rewritten", ".version 7.0\n.target sm_80\n.entry k(.param .u64 __ms_slice) { ret; }\n", "reserved prefix"},
		{"unterminated body", ".version 7.0\n.target sm_80\n.entry k(.param .u64 p) { mov.u32 %r1, %ctaid.x;\n", "unterminated"},
		{"no entry", ".version 7.0\n.target sm_80\n.func f() { ret; }\n", "no .entry"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			p := filepath.Join(dir, strings.ReplaceAll(tc.desc, " ", "_")+".ptx")
			require.NoError(t, os.WriteFile(p, []byte(tc.ptx), 0o600))
			r := rewrite(t, p)
			require.Equal(t, "0", r.module["nsliceable"])
			require.Contains(t, r.module["reason"], tc.reason)
			require.Empty(t, r.out)
		})
	}
}

func TestPTXSlicePlansCoverEveryBlockOnce(t *testing.T) {
	prog := sliceProg(t)
	for _, tc := range []struct {
		desc          string
		gx, gy, gz, b int
		slices        int
	}{
		{"fits: one launch", 100, 1, 1, 128, 1},
		{"1D runs of a row", 1000, 1, 1, 64, 16},
		{"rows of a 2D grid", 8, 100, 1, 20, 50},
		{"runs of rows longer than a slice", 37, 5, 3, 16, 45},
		{"rows of a 3D grid", 8, 6, 5, 20, 15},
		{"planes of a 3D grid", 4, 3, 10, 30, 5},
		{"one block per slice", 3, 3, 3, 1, 27},
		{"a big grid", 100000, 7, 1, 1024, 686},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			pl := parseKV(runLines(t, nil, prog, "plan", strconv.Itoa(tc.gx), strconv.Itoa(tc.gy),
				strconv.Itoa(tc.gz), strconv.Itoa(tc.b))[0])
			blocks := strconv.Itoa(tc.gx * tc.gy * tc.gz)
			require.Equal(t, strconv.Itoa(tc.slices), pl["count"])
			require.Equal(t, pl["planned"], pl["count"])
			require.Equal(t, blocks, pl["blocks"])
			require.Equal(t, blocks, pl["covered_once"], "every block in exactly one slice")
			require.Equal(t, "0", pl["bad"], "no empty or oversized slice, nothing outside the grid")
			maxSlice, _ := strconv.Atoi(pl["max_slice"])
			require.LessOrEqual(t, maxSlice, tc.b)
		})
	}
}

func TestPTXSliceFindsPTXInFatbins(t *testing.T) {
	prog := sliceProg(t)
	lines := runLines(t, nil, prog, "fatbin", filepath.Join("testdata", "ptxslice", "grid3d.ptx"))
	got := map[string]map[string]string{}
	for _, l := range lines {
		kv := parseKV(l)
		if strings.HasPrefix(l, "FATBIN ") {
			got[kv["case"]] = kv
		} else if strings.HasPrefix(l, "IMAGE ") {
			require.Equal(t, map[string]string{"ptx": "1", "cubin": "3", "other": "0"}, kv)
		}
	}
	for _, tc := range []struct {
		name, found, reason string
	}{
		{"cc90", "1", ""},    // the sm_90 PTX, not the sm_80 one
		{"cc86", "1", ""},    // the sm_80 PTX: the sm_90 one is too new
		{"any", "1", ""},     // the newest
		{"wrapper", "1", ""}, // through cudart's fatbin wrapper
		{"cc75", "0", "newer architecture"},
		{"compressed", "0", "compressed"},
		{"elfonly", "0", "carries no PTX"},
	} {
		kv := got[tc.name]
		require.NotNil(t, kv, tc.name)
		require.Equal(t, "2", kv["kind"], tc.name)
		require.Equal(t, tc.found, kv["found"], "%s: %v", tc.name, kv)
		if tc.found == "1" {
			require.Equal(t, "1", kv["match"], "%s: the right PTX entry, whole", tc.name)
		} else {
			require.Contains(t, kv["reason"], tc.reason, tc.name)
		}
	}
}

// On the fake driver grid_probe runs every block of its launch grid as C; the
// variant a rewritten module gets reads __ms_slice. A sliced launch must
// cover every block exactly once with the original index and grid size: the
// same values as an unsliced launch, in the planned number of driver launches.
func TestPTXSliceLaunchOnFakeDriver(t *testing.T) {
	prog := sliceProg(t)
	for _, tc := range []struct {
		desc          string
		gx, gy, gz    int
		blocks        string
		inflight      string
		driverLaunchs int
	}{
		{"1D, 16 blocks a slice", 1000, 1, 1, "16", "", 63},
		{"2D with runs of a row", 37, 5, 3, "16", "", 45},
		{"3D by rows", 8, 6, 5, "20", "1", 15},
		{"3D by planes", 4, 3, 10, "30", "0", 5},
		{"fits in one slice: the program's own launch", 10, 1, 1, "16", "", 1},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			args := []string{"fake", strconv.Itoa(tc.gx), strconv.Itoa(tc.gy), strconv.Itoa(tc.gz), "0x1234"}
			e := newEnv(t)
			e.extra = []string{"MIGSWAP_SLICE_BLOCKS=" + tc.blocks, "MIGSWAP_SLICE_INFLIGHT=" + tc.inflight}
			on := runLines(t, e.environ(), prog, args...)
			e.extra = []string{"MIGSWAP_SLICE_BLOCKS=0"}
			off := runLines(t, e.environ(), prog, args...)
			e.shim = false
			bare := runLines(t, e.environ(), prog, args...)

			f := line(t, on, "FAKE")
			total := strconv.Itoa(tc.gx * tc.gy * tc.gz)
			require.Equal(t, total, f["blocks"])
			require.Equal(t, "0", f["miscount"], "every block ran exactly once")
			require.Equal(t, "0", f["wrong"], "every block saw its own index and the original grid")
			require.Equal(t, strconv.Itoa(tc.driverLaunchs), f["driver_launches"])
			require.Equal(t, "1", f["info"], "the function has a twin: %v", f)
			st := line(t, on, "SLICESTATS")
			require.Equal(t, "1", st["modules_rewritten"])
			require.Equal(t, "1", st["functions_mapped"])
			if tc.driverLaunchs > 1 {
				require.Equal(t, "1", st["sliced_launches"])
				require.Equal(t, strconv.Itoa(tc.driverLaunchs), st["slices"])
			} else {
				require.Equal(t, "0", st["sliced_launches"])
			}
			for _, other := range [][]string{off, bare} {
				g := line(t, other, "FAKE")
				require.Equal(t, "0", g["wrong"])
				require.Equal(t, "1", g["driver_launches"])
				require.Equal(t, f["hash"], g["hash"], "sliced and unsliced results differ")
			}
			require.Equal(t, "-1", line(t, off, "FAKE")["info"], "slicing off")
			require.Equal(t, "0", line(t, off, "SLICESTATS")["modules_rewritten"])
		})
	}
}

// With slicing on, the shim's other tests' program (a module image that is not
// PTX, kernels launched every way) behaves as before.
func TestPTXSliceOnLeavesOtherModulesAlone(t *testing.T) {
	needBin(t)
	e, _ := newEnvWithDaemon(t)
	e.extra = []string{"MIGSWAP_SLICE_BLOCKS=1"}
	p := e.start(t, "dlsym", "basic")
	lines := p.finish(t, 20*time.Second)
	require.Equal(t, "1", line(t, lines, "RESULT")["ok"], "%v", lines)
	require.Equal(t, uint64(9), num(t, line(t, lines, "STATS"), "launches"))
}

// ms_slice_launch against a recording driver: each slice gets the program's
// parameters unchanged plus struct ms_slice_args (appended to kernelParams, or
// after the program's bytes in a CU_LAUNCH_PARAM_BUFFER_POINTER buffer), the
// original grid, at most B blocks, and the between-slices hook runs before
// every slice but the first.
func TestPTXSliceLaunchParameters(t *testing.T) {
	prog := sliceProg(t)
	for _, mode := range []string{"params", "extra"} {
		for _, tc := range []struct {
			g      [3]int
			b      int
			slices int
		}{{[3]int{37, 5, 3}, 16, 45}, {[3]int{100, 1, 1}, 1000, 1}, {[3]int{5, 7, 9}, 70, 5}} {
			l := parseKV(runLines(t, nil, prog, "launch", strconv.Itoa(tc.g[0]), strconv.Itoa(tc.g[1]),
				strconv.Itoa(tc.g[2]), strconv.Itoa(tc.b), mode)[0])
			blocks := strconv.Itoa(tc.g[0] * tc.g[1] * tc.g[2])
			require.Equal(t, "0", l["result"], "%s %v", mode, tc)
			require.Equal(t, strconv.Itoa(tc.slices), l["slices"], "%s %v", mode, tc)
			require.Equal(t, l["slices"], l["launches"])
			require.Equal(t, strconv.Itoa(tc.slices-1), l["betweens"])
			require.Equal(t, blocks, l["covered_once"])
			require.Equal(t, "0", l["bad"], "%s %v: a slice saw wrong parameters or grid", mode, tc)
		}
	}
}

// CUDA 12 libraries: cuLibraryLoadData gets a rewritten twin library; the
// CUkernel (launched as a CUfunction) and cuKernelGetFunction's function are
// sliced like a module's function.
func TestPTXSliceLaunchThroughLibraries(t *testing.T) {
	prog := sliceProg(t)
	for _, how := range []string{"lib", "kernelfn"} {
		t.Run(how, func(t *testing.T) {
			e := newEnv(t)
			e.extra = []string{"MIGSWAP_SLICE_BLOCKS=16"}
			on := runLines(t, e.environ(), prog, "fake", "37", "5", "3", "9", how)
			e.extra = []string{"MIGSWAP_SLICE_BLOCKS=0"}
			off := runLines(t, e.environ(), prog, "fake", "37", "5", "3", "9", how)
			f, g := line(t, on, "FAKE"), line(t, off, "FAKE")
			require.Equal(t, "0", f["miscount"])
			require.Equal(t, "0", f["wrong"])
			require.Equal(t, "45", f["driver_launches"])
			require.Equal(t, "1", f["info"], "%v", f)
			require.Equal(t, "1", g["driver_launches"])
			require.Equal(t, g["hash"], f["hash"])
			require.Equal(t, "1", line(t, on, "SLICESTATS")["sliced_launches"])
		})
	}
}

// MIGSWAP_PTX_CORPUS=dir rewrites every *.ptx under dir (e.g. a Triton or
// NVRTC cache) with the same structural checks; skipped when unset.
func TestPTXSliceRewritesCorpus(t *testing.T) {
	dir := os.Getenv("MIGSWAP_PTX_CORPUS")
	if dir == "" {
		t.Skip("MIGSWAP_PTX_CORPUS not set")
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.ptx"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			r := rewrite(t, f)
			require.Equal(t, "1", r.module["ok"], "%v", r.module)
			n := 0
			for name, e := range r.entries {
				if e["sliceable"] == "1" {
					n++
				} else {
					t.Logf("%s: unsliced: %s", name, e["reason"])
				}
			}
			if n > 0 {
				checkStructure(t, r)
			}
			t.Logf("%d of %d entries sliceable", n, len(r.entries))
		})
	}
}

// The static idempotence check (issue 10 item 3's question, not used by
// slicing): a kernel that never reads global memory it writes can be re-run
// from scratch; atomics, calls it cannot see and memory it cannot place are
// "not proven".
func TestPTXIdempotenceCheck(t *testing.T) {
	dir := filepath.Join("testdata", "ptxslice")
	for _, tc := range []struct {
		file, entry string
		idempotent  bool
		reason      string
	}{
		{"grid3d.ptx", "probe_mov", true, ""},                              // writes out only
		{"grid3d.ptx", "stride_1d", false, "memory of parameter 0"},        // p[i] += 1
		{"params.ptx", "probe_params", true, ""},                           // u8/u32 parameters are no addresses
		{"slicekern.ptx", "grid_probe", false, "atomic read-modify-write"}, // atomicAdd(count)
		{"slicekern.ptx", "spin", true, ""},                                // writes out only
		{"refused.ptx", "calls_tid_func", false, "callee is not analysed"}, // a .func call
		{"refused.ptx", "prints", true, ""},                                // vprintf is harmless
		{"refused.ptx", "device_launch", false, "callee is not analysed"},  // cudaLaunchDeviceV2
		{"misc.ptx", "probe_misc", true, ""},                               // predicated, nested scope
	} {
		t.Run(tc.file+"/"+tc.entry, func(t *testing.T) {
			e := rewrite(t, filepath.Join(dir, tc.file)).entries[tc.entry]
			require.NotNil(t, e)
			require.Equal(t, tc.idempotent, e["idempotent"] == "1", "%v", e)
			require.Contains(t, e["idem_reason"], tc.reason)
		})
	}
}
