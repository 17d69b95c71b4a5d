package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/migctl/migctl/internal/printer"
	"github.com/migctl/migctl/mig"
)

type partitionShowOptions struct {
	streams
	node nodeFlags
	gpus string
	outputOption
}

func newPartitionShowCmd(s streams) *cobra.Command {
	o := &partitionShowOptions{streams: s}
	cmd := &cobra.Command{
		Use:   "show",
		Short: "Show GPUs, MIG mode, and instances with placements and MIG device UUIDs",
		Long: `Show each GPU (index, name, UUID, PCI bus id, MIG mode current and pending) and its
MIG instances: GPU instance id, profile, placement start:size on the 8 memory units,
compute instances with their MIG device UUIDs (what CUDA_VISIBLE_DEVICES takes) and the
processes NVML reports on them.`,
		Example: `  migctl partition show --sim h200x8
  migctl partition show --sim h200x8 --gpus 0,1 -o yaml
  sudo migctl partition show -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.Complete(); err != nil {
				return err
			}
			return o.Run(cmd.Context())
		},
	}
	o.node.add(cmd)
	gpusFlag(cmd, &o.gpus, "GPUs to show")
	o.addOutput(cmd)
	return cmd
}

type showView struct {
	mig.Node `yaml:",inline"`
}

func (v showView) Header() []string {
	return []string{"gpu", "name/profile", "mig", "gi", "ci", "placement", "uuid", "processes"}
}

func modeString(g *mig.GPU) string {
	switch {
	case !g.MIGCapable:
		return "N/A"
	case g.ModePending():
		return fmt.Sprintf("%s (pending %s)", onOff(g.MIGEnabled), onOff(g.MIGPending))
	}
	return onOff(g.MIGEnabled)
}

func (v showView) Rows() [][]string {
	var rows [][]string
	for i := range v.GPUs {
		g := &v.GPUs[i]
		rows = append(rows, []string{strconv.Itoa(g.Index), g.Name, modeString(g), "", "", "", g.UUID, procList(g.Processes)})
		for _, in := range g.Instances {
			if len(in.Compute) == 0 {
				rows = append(rows, []string{strconv.Itoa(g.Index), "  " + in.Profile, "", strconv.Itoa(in.GIID), "-", in.Placement.String(), "(no compute instance)", ""})
			}
			for _, c := range in.Compute {
				rows = append(rows, []string{strconv.Itoa(g.Index), "  " + c.Profile, "", strconv.Itoa(in.GIID), strconv.Itoa(c.CIID),
					in.Placement.String(), c.UUID, procList(c.Processes)})
			}
		}
	}
	return rows
}

func procList(ps []mig.Process) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = strconv.Itoa(int(p.PID))
	}
	return strings.Join(s, ",")
}

// Run shows the node.
func (o *partitionShowOptions) Run(ctx context.Context) error {
	return withNode(ctx, &o.node, func(ctx context.Context, on *openedNode) error {
		noteInterrupted(o.ErrOut, on)
		node, gpus, err := on.discover(o.gpus)
		if err != nil {
			return err
		}
		v := showView{Node: mig.Node{DriverVersion: node.DriverVersion}}
		for _, i := range gpus {
			g := node.GPUs[i]
			if o.format == printer.Table {
				g.Profiles = nil
			}
			v.GPUs = append(v.GPUs, g)
		}
		return printer.Print(o.Out, o.format, v)
	})
}
