package main

import (
	"context"
	"errors"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/migctl/migctl/internal/printer"
	"github.com/migctl/migctl/mig"
)

var errEmptyName = errors.New("--name must not be empty")

type partitionModeOptions struct {
	streams
	node   nodeFlags
	gpus   string
	enable bool
	force  bool
	outputOption
}

func newPartitionModeCmd(s streams) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "mode",
		Short: "Enable or disable MIG mode (never resets a GPU)",
		Long: `Enable or disable MIG mode on GPUs.

enable leaves GPUs already in MIG mode (and their instances) alone. On Hopper (H100, H200)
the change normally takes effect at once; with processes on the GPU, or always on Ampere
(A100), it stays pending until the GPU is reset. migctl never resets a GPU: it reports the
pending state and what to do (stop the processes, 'sudo nvidia-smi -r -i N' or reboot).

disable first destroys the GPU's instances as a journalled apply (refusing instances with
processes unless --force), then turns MIG off.`,
		Example: `  migctl partition mode enable --sim h200x8 --gpus all
  migctl partition mode enable --sim a100x8 --gpus 0      # pending until reset
  sudo migctl partition mode disable --gpus 3`,
	}
	cmd.AddCommand(newPartitionModeSubCmd(s, true), newPartitionModeSubCmd(s, false))
	return cmd
}

func newPartitionModeSubCmd(s streams, enable bool) *cobra.Command {
	o := &partitionModeOptions{streams: s, enable: enable}
	use, short := "enable", "Turn MIG mode on"
	long := `Turn MIG mode on for the selected GPUs (--gpus, default all). GPUs already in MIG mode,
and their instances, are left alone (a disable still pending is withdrawn); a GPU with MIG
on has no instances until a layout is applied ('migctl partition apply').

The CURRENT and PENDING columns show NVML's two modes. On Hopper (H100, H200) the change
takes effect at once when the GPU is idle; with processes on it, and always on Ampere
(A100), it stays pending: OUTCOME says "pending" and ACTION what to do (stop the
processes, reset the GPU with 'sudo nvidia-smi -r -i N', or reboot). migctl never resets a
GPU. A pending change is not an error for this command (exit 0); apply exits 1 until it
has taken effect.`
	example := `  migctl partition mode enable --sim h200x8
  migctl partition mode enable --sim a100x8 --gpus 0     # Ampere: pending until reset
  migctl partition sim reset --sim a100x8 --gpus 0       # the simulator's stand-in for the reset
  sudo migctl partition mode enable --gpus 0,1 -o json`
	if !enable {
		use, short = "disable", "Destroy the instances and turn MIG mode off"
		long = `Turn MIG mode off for the selected GPUs (--gpus, default all). The GPU's instances are
destroyed first, as a journalled apply of "MIG off": instances with processes are refused
unless --force (and NVML itself still refuses while a process runs, in which case the GPU
is rolled back). GPUs with MIG already off are left alone. A change left pending is
reported as for enable.`
		example = `  migctl partition mode disable --sim h200x8 --gpus 3
  sudo migctl partition mode disable --gpus all --force`
	}
	cmd := &cobra.Command{
		Use:     use,
		Short:   short,
		Long:    long,
		Example: example,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.Complete(); err != nil {
				return err
			}
			return o.Run(cmd.Context())
		},
	}
	o.node.add(cmd)
	gpusFlag(cmd, &o.gpus, "GPUs")
	if !enable {
		cmd.Flags().BoolVar(&o.force, "force", false, "allow destroying instances that have processes")
	}
	o.addOutput(cmd)
	return cmd
}

type modeView struct {
	GPUs []mig.ModeResult `json:"gpus" yaml:"gpus"`
}

func (v modeView) Header() []string {
	return []string{"gpu", "current", "pending", "outcome", "action"}
}

func (v modeView) Rows() [][]string {
	var rows [][]string
	for _, r := range v.GPUs {
		rows = append(rows, []string{strconv.Itoa(r.GPU), onOff(r.Current), onOff(r.Pending), r.Outcome, r.Action})
	}
	return rows
}

// Run changes the mode.
func (o *partitionModeOptions) Run(ctx context.Context) error {
	return withNode(ctx, &o.node, func(ctx context.Context, on *openedNode) error {
		m, err := on.manager(o.ErrOut)
		if err != nil {
			return err
		}
		node, err := m.Discover(ctx)
		if err != nil {
			return err
		}
		gpus, err := mig.SelectGPUs(o.gpus, node)
		if err != nil {
			return err
		}
		if o.enable {
			res, err := m.EnableMIG(ctx, gpus)
			if err != nil {
				return err
			}
			for _, r := range res {
				if r.Outcome == "pending" {
					simResetHint(o.ErrOut, on, mig.ErrModePending)
					break
				}
			}
			return printer.Print(o.Out, o.format, modeView{res})
		}
		reqs := map[int]mig.Request{}
		for _, i := range gpus {
			reqs[i] = mig.Request{MIGEnabled: false}
		}
		_, applyErr := m.Apply(ctx, reqs, mig.ApplyOptions{PlanOptions: mig.PlanOptions{Force: o.force}})
		after, err := m.Discover(ctx)
		if err != nil {
			return err
		}
		var v modeView
		for _, i := range gpus {
			g := after.GPUs[i]
			r := mig.ModeResult{GPU: i, Current: g.MIGEnabled, Pending: g.MIGPending, Outcome: "disabled"}
			switch {
			case g.ModePending():
				r.Outcome = "pending"
				r.Action = "reset the GPU (sudo nvidia-smi -r -i " + strconv.Itoa(i) + ") or reboot"
			case g.MIGEnabled:
				r.Outcome = "unchanged"
			}
			v.GPUs = append(v.GPUs, r)
		}
		if err := printer.Print(o.Out, o.format, v); err != nil {
			return err
		}
		return applyErr
	})
}
