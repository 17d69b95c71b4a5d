package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/spf13/cobra"

	"github.com/migctl/migctl/mig"
	"github.com/migctl/migctl/mig/migsim"
)

// Environment variables the partition commands read.
const (
	envSim      = "MIGCTL_SIM"       // default for --sim
	envSimState = "MIGCTL_SIM_STATE" // default for --sim-state
	envJournal  = "MIGCTL_JOURNAL"   // default for --journal
	// envCrashAfterStep makes apply/recover SIGKILL themselves right after the
	// given step (counted from 1 across the whole run) has completed and been
	// journalled. A testing aid for crash-consistency tests; never set it in
	// production.
	envCrashAfterStep = "MIGCTL_TEST_CRASH_AFTER_STEP"
)

func newPartitionCmd(s streams) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "partition",
		Short: "Declare, plan and apply MIG layouts (real NVML, or --sim for a simulated node)",
		Long: `Partition MIG GPUs declaratively.

A layout says which MIG devices each GPU should have: a mig-parted v1 file (-f FILE -c NAME)
or the --layout shorthand with --gpus. migctl plans placements on the GPU's 8 memory units
that follow the hardware's rules, keeps instances that already match (and never destroys one
with processes unless --force), and applies the difference as a journalled transaction:
a failed step rolls the GPU back, and after a crash 'migctl partition recover' (or the next
apply) finishes the job. migctl never resets a GPU.

Without --sim, migctl drives the GPUs through NVML (root needed to change them). With
--sim h200x8 (or h200, h100x8, a100x8, a100-40gbx8, ...) it drives a simulated node whose
state lives in a file (--sim-state), so consecutive commands see the same node.`,
		Example: `  # what the simulated H200 offers
  migctl partition profiles --sim h200x8

  # split every GPU, look, check, and write the layout back out as mig-parted YAML
  migctl partition apply  --sim h200x8 --gpus all --layout '3g.71gb=1,2g.35gb=1,1g.18gb=1'
  migctl partition show   --sim h200x8
  migctl partition assert --sim h200x8 --gpus all --layout '3g.71gb=1,2g.35gb=1,1g.18gb=1'
  migctl partition export --sim h200x8 > layout.yaml

  # the same from a mig-parted file, on real GPUs
  sudo migctl partition apply -f layout.yaml -c current`,
	}
	cmd.AddCommand(
		newPartitionProfilesCmd(s),
		newPartitionShowCmd(s),
		newPartitionPlanCmd(s),
		newPartitionApplyCmd(s),
		newPartitionAssertCmd(s),
		newPartitionExportCmd(s),
		newPartitionModeCmd(s),
		newPartitionRecoverCmd(s),
		newPartitionSimCmd(s),
	)
	return cmd
}

// nodeFlags select the node: real NVML or a simulated one, and the journal.
type nodeFlags struct {
	sim      string
	simState string
	journal  string
}

func (f *nodeFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.sim, "sim", os.Getenv(envSim),
		"drive a simulated node instead of NVML: h200x8, h200, h100x8, a100x8, a100-40gbx8, a100-80gbx8, ... (env "+envSim+")")
	cmd.Flags().StringVar(&f.simState, "sim-state", os.Getenv(envSimState),
		"state file of the simulated node (env "+envSimState+"; default $XDG_STATE_HOME/migctl/sim-<sim>.json)")
	cmd.Flags().StringVar(&f.journal, "journal", os.Getenv(envJournal),
		"apply journal (env "+envJournal+"; default <sim-state>.journal with --sim, else "+mig.DefaultJournalPath+")")
}

// statePath is the simulated node's state file.
func (f *nodeFlags) statePath() (string, error) {
	if f.simState != "" {
		return f.simState, nil
	}
	dir := os.Getenv("XDG_STATE_HOME")
	if dir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("finding a place for the simulator state (set --sim-state): %w", err)
		}
		dir = filepath.Join(home, ".local", "state")
	}
	return filepath.Join(dir, "migctl", "sim-"+f.sim+".json"), nil
}

// openedNode is an initialised nvml.Interface and how to let it go.
type openedNode struct {
	lib     nvml.Interface
	sim     *migsim.Node
	simArgs string // "--sim h200x8 [--sim-state PATH]", to repeat in hints
	journal string
	close   func()
}

// open initialises the node: the simulator (locking its state file) or NVML.
func (f *nodeFlags) open() (*openedNode, error) {
	if f.sim != "" {
		model, n, err := migsim.ParseSpec(f.sim)
		if err != nil {
			return nil, fmt.Errorf("--sim: %w", err)
		}
		path, err := f.statePath()
		if err != nil {
			return nil, err
		}
		node, err := migsim.Open(path, model, n)
		if err != nil {
			return nil, err
		}
		j := f.journal
		if j == "" {
			j = path + ".journal"
		}
		args := "--sim " + f.sim
		if f.simState != "" && f.simState != os.Getenv(envSimState) {
			args += " --sim-state " + f.simState
		}
		return &openedNode{lib: node, sim: node, simArgs: args, journal: j, close: func() { node.Close() }}, nil
	}
	lib := nvml.New()
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("initialising NVML: %s (no NVIDIA driver here? use --sim h200x8 for a simulated node)", nvml.ErrorString(ret))
	}
	j := f.journal
	if j == "" {
		j = mig.DefaultJournalPath
	}
	return &openedNode{lib: lib, journal: j, close: func() { lib.Shutdown() }}, nil
}

// discover reads the node and resolves a --gpus selection on it.
func (o *openedNode) discover(gpus string) (*mig.Node, []int, error) {
	node, err := mig.Discover(o.lib)
	if err != nil {
		return nil, nil, err
	}
	sel, err := mig.SelectGPUs(gpus, node)
	if err != nil {
		return nil, nil, err
	}
	return node, sel, nil
}

// manager builds a mig.Manager with the journal, progress on errOut and
// the crash hook when its environment variable is set.
func (o *openedNode) manager(errOut io.Writer) (*mig.Manager, error) {
	opts := []mig.Option{mig.WithJournal(o.journal), mig.WithProgress(errOut)}
	if v := os.Getenv(envCrashAfterStep); v != "" {
		k, err := strconv.Atoi(v)
		if err != nil {
			return nil, fmt.Errorf("%s=%q: not a step number", envCrashAfterStep, v)
		}
		opts = append(opts, mig.WithStepHook(func(_, n int, _ mig.Step) {
			if n == k {
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {} // never continue past the crash point
			}
		}))
	}
	return mig.NewManager(o.lib, opts...), nil
}

// noteInterrupted tells the admin, on w, that the journal holds an apply a
// crash interrupted: what read-only commands show is then half-changed until
// 'migctl partition recover' (or the next apply) converges it. A journal
// that cannot be read (not root) is passed over in silence.
func noteInterrupted(w io.Writer, on *openedNode) {
	tx, err := mig.NewJournal(on.journal).Pending()
	if err != nil || tx == nil {
		return
	}
	fmt.Fprintf(w, "note: an apply was interrupted on GPU %d (%d of %d steps done, journal %s); "+
		"run 'migctl partition recover' or apply again to finish it\n", tx.GPU, tx.Done, len(tx.Steps), on.journal)
}

// targetFlags say what layout is wanted where: -f/-c or --layout/--gpus.
type targetFlags struct {
	file   string
	config string
	layout string
	gpus   string
	// gpusSet says whether --gpus was given (its default is "all").
	gpusSet func() bool
	data    []byte // -f's contents, read by validate
}

func (f *targetFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVarP(&f.file, "file", "f", "", "mig-parted v1 layout file ('-': standard input; at most 1 MiB)")
	cmd.Flags().StringVarP(&f.config, "config", "c", "", "configuration name in the file (may be omitted when the file has one)")
	cmd.Flags().StringVar(&f.layout, "layout", "",
		"layout shorthand, MIG enabled: PROFILE=COUNT or PROFILE@START, comma-separated, e.g. '1g.18gb=2,3g.71gb@4'; 'none' for no instances")
	gpusFlag(cmd, &f.gpus, "GPUs for --layout")
	f.gpusSet = func() bool { return cmd.Flags().Changed("gpus") }
}

// gpusFlag registers --gpus on cmd. Its default is "all"; an empty value is
// an error (mig.SelectGPUs), so a stray --gpus "$EMPTY" never means every GPU.
func gpusFlag(cmd *cobra.Command, v *string, what string) {
	cmd.Flags().StringVar(v, "gpus", "all", what+": 'all' or GPU indices, UUIDs or PCI bus ids, comma-separated")
}

// validate checks the flag combination and reads -f (from in for "-"), so
// an unreadable or oversized file fails before the node is opened.
func (f *targetFlags) validate(in io.Reader) error {
	switch {
	case f.file != "" && f.layout != "":
		return errors.New("give either -f FILE or --layout, not both")
	case f.file == "" && f.layout == "":
		return errors.New("give a layout: -f FILE [-c NAME], or --layout '1g.18gb=2,3g.71gb=1' [--gpus 0,1|all]")
	case f.file != "" && f.gpusSet != nil && f.gpusSet():
		return errors.New("--gpus goes with --layout; a file selects its devices itself")
	}
	if f.file != "" {
		data, err := mig.ReadConfigFile(f.file, in)
		if err != nil {
			return err
		}
		f.data = data
	}
	return nil
}

// requests resolves the target against node (GPU index -> request).
func (f *targetFlags) requests(node *mig.Node) (map[int]mig.Request, error) {
	if f.layout != "" {
		r, err := mig.ParseLayout(f.layout)
		if err != nil {
			return nil, err
		}
		gpus, err := mig.SelectGPUs(f.gpus, node)
		if err != nil {
			return nil, err
		}
		out := map[int]mig.Request{}
		for _, g := range gpus {
			out[g] = r
		}
		return out, nil
	}
	name := f.file
	if name == "-" {
		name = "<stdin>"
	}
	cfg, err := mig.ParseConfig(f.data, name)
	if err != nil {
		return nil, err
	}
	config := f.config
	if config == "" {
		if names := cfg.Names(); len(names) == 1 {
			config = names[0]
		} else {
			return nil, fmt.Errorf("%w: %s has %d configurations; pick one with -c (%v)", mig.ErrBadConfig, name, len(names), names)
		}
	}
	reqs, err := cfg.Requests(config, node)
	if err != nil {
		return nil, err
	}
	if len(reqs) == 0 {
		// nothing to apply or assert: a wrong -c, or a file for other GPUs
		ids := map[string]bool{}
		var have []string
		for _, g := range node.GPUs {
			id := fmt.Sprintf("0x%08X", g.PCIDeviceID)
			if !ids[id] {
				ids[id] = true
				have = append(have, id+" ("+g.Name+")")
			}
		}
		return nil, fmt.Errorf("%w: %s: configuration %q selects no GPU of this node (check its devices and device-filter; this node has %s)",
			mig.ErrBadConfig, name, config, strings.Join(have, ", "))
	}
	return reqs, nil
}

// withNode opens the node, runs f and closes it. SIGINT/SIGTERM/SIGHUP
// cancel ctx: an apply then stops after the current step and rolls the GPU
// back. SIGPIPE is ignored: a closed output pipe ('apply ... | head -1')
// makes writes fail instead of killing an apply between two steps.
func withNode(ctx context.Context, nf *nodeFlags, f func(ctx context.Context, on *openedNode) error) error {
	signal.Ignore(syscall.SIGPIPE)
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	on, err := nf.open()
	if err != nil {
		return err
	}
	defer on.close()
	return f(ctx, on)
}

func onOff(b bool) string {
	if b {
		return "Enabled"
	}
	return "Disabled"
}
