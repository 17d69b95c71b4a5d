package main

import (
	"context"
	"fmt"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/migctl/migctl/internal/printer"
	"github.com/migctl/migctl/mig"
)

type partitionPlanOptions struct {
	streams
	node   nodeFlags
	target targetFlags
	force  bool
	outputOption
}

func newPartitionPlanCmd(s streams) *cobra.Command {
	o := &partitionPlanOptions{streams: s}
	cmd := &cobra.Command{
		Use:   "plan",
		Short: "Plan a layout: placements, what is kept, and the steps; changes nothing",
		Long: `Plan a layout without changing anything: for each GPU, the target instances with their
placements on the 8 memory units, which existing instances are kept, and the NVML steps
(enable MIG, destroy compute/GPU instances, create with explicit placements) apply would run.

An infeasible layout fails with the profile that could not be placed and the memory units
that were free; a bad layout fails naming the entry (and line, for files).`,
		Example: `  migctl partition plan --sim h200x8 --gpus 0 --layout '4g.71gb=1,3g.71gb=1'
  migctl partition plan --sim h200x8 --gpus all --layout '1g.35gb=4'
  migctl partition plan --sim h200x8 --layout '3g.71gb@4,2g.35gb=2' -o yaml
  migctl partition plan -f layout.yaml -c balanced`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.Complete(); err != nil {
				return err
			}
			if err := o.Validate(); err != nil {
				return err
			}
			return o.Run(cmd.Context())
		},
	}
	o.node.add(cmd)
	o.target.add(cmd)
	cmd.Flags().BoolVar(&o.force, "force", false, "plan to destroy instances that have processes")
	o.addOutput(cmd)
	return cmd
}

// Validate checks the flag combination and reads -f.
func (o *partitionPlanOptions) Validate() error { return o.target.validate(o.In) }

type planView struct {
	*mig.Plan `yaml:",inline"`
}

func (v planView) Header() []string { return []string{"gpu", "step", "action"} }

func (v planView) Rows() [][]string {
	var rows [][]string
	for _, g := range v.GPUs {
		gi := strconv.Itoa(g.GPU)
		rows = append(rows, []string{gi, "", fmt.Sprintf("current: %s", g.Current)})
		rows = append(rows, []string{gi, "", fmt.Sprintf("target:  %s", g.Target)})
		if len(g.Kept) > 0 {
			rows = append(rows, []string{gi, "", fmt.Sprintf("keep:    %s", g.Kept)})
		}
		if g.NoOp() {
			rows = append(rows, []string{gi, "-", "nothing to do"})
		}
		for k, s := range g.Steps {
			rows = append(rows, []string{gi, strconv.Itoa(k + 1), s.String()})
		}
	}
	return rows
}

// Run plans and prints.
func (o *partitionPlanOptions) Run(ctx context.Context) error {
	return withNode(ctx, &o.node, func(ctx context.Context, on *openedNode) error {
		noteInterrupted(o.ErrOut, on)
		node, err := mig.Discover(on.lib)
		if err != nil {
			return err
		}
		reqs, err := o.target.requests(node)
		if err != nil {
			return err
		}
		plan, err := mig.PlanNode(node, reqs, mig.PlanOptions{Force: o.force})
		if err != nil {
			return err
		}
		return printer.Print(o.Out, o.format, planView{plan})
	})
}
