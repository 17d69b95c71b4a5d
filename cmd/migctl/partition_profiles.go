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

type partitionProfilesOptions struct {
	streams
	node nodeFlags
	gpus string
	outputOption
}

func newPartitionProfilesCmd(s streams) *cobra.Command {
	o := &partitionProfilesOptions{streams: s}
	cmd := &cobra.Command{
		Use:   "profiles",
		Short: "List the GPU-instance profiles each GPU offers, with their placements",
		Long: `List the GPU-instance profiles of each kind of GPU on the node, as NVML reports them:
profile name (as nvidia-smi prints it), NVML profile id, compute slices, maximum count,
SMs, copy engines, memory, and the allowed placements start:size on the 8 memory units.
GPUs of the same model share one block.`,
		Example: `  migctl partition profiles --sim h200x8
  migctl partition profiles --sim a100-40gbx8 -o json
  sudo migctl partition profiles --gpus 0`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.Complete(); err != nil {
				return err
			}
			return o.Run(cmd.Context())
		},
	}
	o.node.add(cmd)
	gpusFlag(cmd, &o.gpus, "GPUs to list")
	o.addOutput(cmd)
	return cmd
}

// profileGroup is one GPU model and its profiles.
type profileGroup struct {
	Name     string          `json:"name" yaml:"name"`
	GPUs     []int           `json:"gpus" yaml:"gpus"`
	Profiles []mig.GIProfile `json:"profiles" yaml:"profiles"`
}

type profilesView struct {
	Models []profileGroup `json:"models" yaml:"models"`
}

func (v profilesView) Header() []string {
	return []string{"gpus", "profile", "id", "slices", "max", "sms", "ces", "memory", "placements"}
}

func (v profilesView) Rows() [][]string {
	var rows [][]string
	for _, m := range v.Models {
		for _, p := range m.Profiles {
			pl := make([]string, len(p.Placements))
			for i, x := range p.Placements {
				pl[i] = x.String()
			}
			rows = append(rows, []string{intList(m.GPUs), p.Name, strconv.Itoa(int(p.ID)), strconv.Itoa(p.Slices),
				strconv.Itoa(p.MaxCount), strconv.Itoa(p.SMs), strconv.Itoa(p.CopyEngines),
				fmt.Sprintf("%.2f GiB", float64(p.MemoryMB)/1024), strings.Join(pl, " ")})
		}
	}
	return rows
}

func intList(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}

// Run lists the profiles.
func (o *partitionProfilesOptions) Run(ctx context.Context) error {
	return withNode(ctx, &o.node, func(ctx context.Context, on *openedNode) error {
		node, gpus, err := on.discover(o.gpus)
		if err != nil {
			return err
		}
		var v profilesView
		for _, i := range gpus {
			g := node.GPUs[i]
			if !g.MIGCapable {
				continue
			}
			found := false
			for k := range v.Models {
				if v.Models[k].Name == g.Name {
					v.Models[k].GPUs = append(v.Models[k].GPUs, i)
					found = true
				}
			}
			if !found {
				v.Models = append(v.Models, profileGroup{Name: g.Name, GPUs: []int{i}, Profiles: g.Profiles})
			}
		}
		return printer.Print(o.Out, o.format, v)
	})
}
