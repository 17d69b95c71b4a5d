package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/spf13/cobra"

	"github.com/migctl/migctl/internal/bytesize"
	"github.com/migctl/migctl/internal/printer"
	"github.com/migctl/migctl/mig"
	"github.com/migctl/migctl/mig/migsim"
)

// partitionSimOptions drive the simulated node's stand-ins for things an
// admin or a workload does outside migctl: resetting a GPU, running a process
// on a MIG device.
type partitionSimOptions struct {
	streams
	node  nodeFlags
	gpus  string
	gi    int
	ci    int
	pid   uint32
	bytes string
	used  uint64 // attach: --bytes, parsed by Validate
	mig   string // attach: a MIG device UUID instead of --gpus/--gi/--ci

	outputOption
}

// simEvent is what one sim verb did to one GPU.
type simEvent struct {
	GPU    int    `json:"gpu" yaml:"gpu"`
	Action string `json:"action" yaml:"action"` // reset, attached, detached
	PID    uint32 `json:"pid,omitempty" yaml:"pid,omitempty"`
	GIID   *int   `json:"gpuInstanceId,omitempty" yaml:"gpuInstanceId,omitempty"`
	CIID   *int   `json:"computeInstanceId,omitempty" yaml:"computeInstanceId,omitempty"`
}

type simView struct {
	Events []simEvent `json:"events" yaml:"events"`
}

func (v simView) Header() []string { return []string{"gpu", "action", "pid", "gi", "ci"} }

func (v simView) Rows() [][]string {
	opt := func(p *int) string {
		if p == nil {
			return ""
		}
		return strconv.Itoa(*p)
	}
	var rows [][]string
	for _, e := range v.Events {
		pid := ""
		if e.PID != 0 {
			pid = strconv.FormatUint(uint64(e.PID), 10)
		}
		rows = append(rows, []string{strconv.Itoa(e.GPU), e.Action, pid, opt(e.GIID), opt(e.CIID)})
	}
	return rows
}

func newPartitionSimCmd(s streams) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Act on a simulated node: reset a GPU, attach or detach a fake process",
		Long: `Stand-ins, on a simulated node (--sim), for what happens outside migctl on a real one:
'reset' is the admin's GPU reset (a pending MIG mode change takes effect), 'attach' and
'detach' start and stop a fake process on a MIG device (or on the whole GPU with --gi -1),
which makes its instance busy: apply will not destroy it, and NVML answers IN_USE.`,
		Example: `  migctl partition mode enable --sim a100x8 --gpus 0     # pending on Ampere
  migctl partition sim reset --sim a100x8 --gpus 0
  migctl partition sim attach --sim h200x8 --gpus 0 --gi 2 --ci 0 --pid 4242 --bytes 10GiB
  migctl partition sim detach --sim h200x8 --gpus 0 --pid 4242`,
	}
	for _, verb := range []string{"reset", "attach", "detach"} {
		cmd.AddCommand(newPartitionSimVerbCmd(s, verb))
	}
	return cmd
}

func newPartitionSimVerbCmd(s streams, verb string) *cobra.Command {
	o := &partitionSimOptions{streams: s}
	short := map[string]string{
		"reset":  "Reset GPUs (a pending MIG mode change takes effect)",
		"attach": "Attach a fake process to a MIG device (--mig UUID, or --gi/--ci) or the whole GPU (--gi -1)",
		"detach": "Detach a fake process",
	}[verb]
	long := map[string]string{
		"reset": `Stand in for the admin's GPU reset ('sudo nvidia-smi -r -i N') on a simulated node: a
pending MIG mode change takes effect. Refused, as on real hardware, while processes run on
the GPU.`,
		"attach": `Start a fake process on a simulated node: on a MIG device, named by its UUID (--mig, as
'partition show' prints it) or by --gpus N --gi GI --ci CI, or on the whole GPU (--gi -1,
the default without --mig). NVML then reports it (show's PROCESSES column), apply will not
destroy its instance without --force, and NVML answers IN_USE to destroying it.`,
		"detach": `Stop a fake process on a simulated node (--pid), wherever it runs on the selected GPUs.`,
	}[verb]
	example := map[string]string{
		"reset": `  migctl partition mode enable --sim a100x8 --gpus 0     # pending on Ampere
  migctl partition sim reset --sim a100x8 --gpus 0`,
		"attach": `  migctl partition show --sim h200x8 --gpus 0             # find a MIG device UUID
  migctl partition sim attach --sim h200x8 --mig MIG-3284b0b1-8050-20ae-b6b6-956bb3612660 --pid 4242
  migctl partition sim attach --sim h200x8 --gpus 0 --gi 2 --ci 0 --pid 4242 --bytes 10GiB`,
		"detach": `  migctl partition sim detach --sim h200x8 --pid 4242`,
	}[verb]
	cmd := &cobra.Command{
		Use:     verb,
		Short:   short,
		Long:    long,
		Example: example,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.Complete(); err != nil {
				return err
			}
			if err := o.Validate(verb, cmd); err != nil {
				return err
			}
			return o.Run(cmd.Context(), verb)
		},
	}
	o.node.add(cmd)
	gpusFlag(cmd, &o.gpus, "GPUs")
	if verb != "reset" {
		cmd.Flags().Uint32Var(&o.pid, "pid", 0, "process id")
	}
	if verb == "attach" {
		cmd.Flags().IntVar(&o.gi, "gi", -1, "GPU instance id (-1: the whole GPU)")
		cmd.Flags().IntVar(&o.ci, "ci", 0, "compute instance id")
		cmd.Flags().StringVar(&o.bytes, "bytes", "1GiB", "GPU memory the process uses ("+bytesize.Units+")")
		cmd.Flags().StringVar(&o.mig, "mig", "", "MIG device UUID to attach to (instead of --gpus/--gi/--ci)")
	}
	o.addOutput(cmd)
	return cmd
}

// Validate checks that a simulated node is named and a process given, and
// parses --bytes.
func (o *partitionSimOptions) Validate(verb string, cmd *cobra.Command) error {
	if o.node.sim == "" {
		return errors.New("partition sim acts on simulated nodes only: give --sim (or set " + envSim + ")")
	}
	if verb != "reset" && o.pid == 0 {
		return fmt.Errorf("partition sim %s: give the process id (--pid N, not 0)", verb)
	}
	if o.mig != "" {
		for _, f := range []string{"gpus", "gi", "ci"} {
			if cmd.Flags().Changed(f) {
				return fmt.Errorf("--mig names the MIG device; leave out --%s", f)
			}
		}
	}
	if verb == "attach" {
		n, err := bytesize.Parse(o.bytes)
		if err != nil {
			return fmt.Errorf("--bytes: %w", err)
		}
		o.used = uint64(n)
	}
	return nil
}

// Run acts.
func (o *partitionSimOptions) Run(ctx context.Context, verb string) error {
	return withNode(ctx, &o.node, func(ctx context.Context, on *openedNode) error {
		node, err := mig.Discover(on.lib)
		if err != nil {
			return err
		}
		if o.mig != "" {
			found := false
			for _, d := range node.MIGDevices() {
				if strings.EqualFold(d.UUID, o.mig) {
					o.gpus, o.gi, o.ci = strconv.Itoa(d.GPU), d.GIID, d.CIID
					found = true
				}
			}
			if !found {
				return fmt.Errorf("--mig %s: no such MIG device on this node ('migctl partition show' lists them)", o.mig)
			}
		}
		gpus, err := mig.SelectGPUs(o.gpus, node)
		if err != nil {
			return err
		}
		var v simView
		for _, g := range gpus {
			switch verb {
			case "reset":
				if r := on.sim.Reset(g); r != nvml.SUCCESS {
					return fmt.Errorf("resetting GPU %d: %s", g, nvml.ErrorString(r))
				}
				v.Events = append(v.Events, simEvent{GPU: g, Action: "reset"})
			case "attach":
				if err := on.sim.AttachProcess(g, o.gi, o.ci, o.pid, o.used); err != nil {
					return err
				}
				e := simEvent{GPU: g, Action: "attached", PID: o.pid}
				if o.gi >= 0 {
					gi, ci := o.gi, o.ci
					e.GIID, e.CIID = &gi, &ci
				}
				v.Events = append(v.Events, e)
			case "detach":
				err := on.sim.DetachProcess(g, o.pid)
				if errors.Is(err, migsim.ErrNoProcess) {
					continue // not on this one of the selected GPUs
				}
				if err != nil {
					return err
				}
				v.Events = append(v.Events, simEvent{GPU: g, Action: "detached", PID: o.pid})
			}
		}
		if verb == "detach" && len(v.Events) == 0 {
			return fmt.Errorf("process %d runs on none of the selected GPUs ('migctl partition show' lists the processes)", o.pid)
		}
		return printer.Print(o.Out, o.format, v)
	})
}

// simResetHint tells the user of a simulated node how to stand in for a reset.
func simResetHint(w io.Writer, on *openedNode, err error) {
	if on.sim != nil && errors.Is(err, mig.ErrModePending) {
		fmt.Fprintf(w, "note: on this simulated node, 'migctl partition sim reset %s --gpus N' stands for the GPU reset\n", on.simArgs)
	}
}
