package main

import (
	"context"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/migctl/migctl/internal/printer"
	"github.com/migctl/migctl/mig"
)

type partitionApplyOptions struct {
	streams
	node   nodeFlags
	target targetFlags
	dryRun bool
	force  bool
	outputOption
}

func newPartitionApplyCmd(s streams) *cobra.Command {
	o := &partitionApplyOptions{streams: s}
	cmd := &cobra.Command{
		Use:   "apply",
		Short: "Apply a layout by diff, as a journalled transaction per GPU",
		Long: `Apply a layout. First any apply a crash interrupted is recovered. Then, per GPU: MIG mode
is enabled if needed (a GPU left pending is reported with what the admin must do; migctl
never resets a GPU), instances that already match are kept, instances with processes are
never destroyed (unless --force: NVML itself still refuses while processes run), compute
instances go before their GPU instance, and new GPU instances are created at the planned
placements. The steps are journalled before they run; a failed step rolls the GPU back to
its previous layout and apply exits non-zero. Progress goes to stderr, the result to stdout.

Exit status: 0 when every selected GPU was applied or already right; 1 with a one-line
reason on stderr otherwise (bad input or infeasible layout, both before anything changes;
an instance with processes in the way; a failed step, rolled back; a MIG mode change left
pending). GPUs applied before a failure keep their new layout; the rest are untouched.`,
		Example: `  # the demo layout on every GPU of a simulated 8x H200 node
  migctl partition apply --sim h200x8 --gpus all --layout '3g.71gb=1,2g.35gb=1,1g.18gb=1'

  # pin a 3g.71gb to memory units 4-7 on GPUs 0 and 1, let the planner place the rest
  migctl partition apply --sim h200x8 --gpus 0,1 --layout '3g.71gb@4,1g.18gb=3'

  # from a mig-parted file; --dry-run shows the plan only
  sudo migctl partition apply -f layout.yaml -c balanced --dry-run
  sudo migctl partition apply -f layout.yaml -c balanced`,
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
	cmd.Flags().BoolVar(&o.dryRun, "dry-run", false, "print the plan and change nothing")
	cmd.Flags().BoolVar(&o.force, "force", false, "allow destroying instances that have processes")
	o.addOutput(cmd)
	return cmd
}

// Validate checks the flag combination and reads -f.
func (o *partitionApplyOptions) Validate() error { return o.target.validate(o.In) }

type applyView struct {
	*mig.ApplyResult `yaml:",inline"`
}

func (v applyView) Header() []string { return []string{"gpu", "outcome", "steps", "layout", "action"} }

func (v applyView) Rows() [][]string {
	migOff := map[int]bool{} // GPUs the layout wants with MIG off
	if v.Plan != nil {
		for _, p := range v.Plan.GPUs {
			migOff[p.GPU] = !p.Request.MIGEnabled
		}
	}
	var rows [][]string
	for _, g := range v.GPUs {
		act := g.Action
		if act == "" {
			act = g.Error
		}
		layout := g.Layout.String()
		if migOff[g.GPU] && (g.Outcome == "applied" || g.Outcome == "unchanged" || g.Outcome == "planned") {
			layout = "MIG disabled"
		}
		rows = append(rows, []string{strconv.Itoa(g.GPU), g.Outcome, strconv.Itoa(g.Steps), layout, act})
	}
	return rows
}

// Run applies.
func (o *partitionApplyOptions) Run(ctx context.Context) error {
	return withNode(ctx, &o.node, func(ctx context.Context, on *openedNode) error {
		m, err := on.manager(o.ErrOut)
		if err != nil {
			return err
		}
		node, err := m.Discover(ctx)
		if err != nil {
			return err
		}
		reqs, err := o.target.requests(node)
		if err != nil {
			return err
		}
		res, err := m.Apply(ctx, reqs, mig.ApplyOptions{DryRun: o.dryRun, PlanOptions: mig.PlanOptions{Force: o.force}})
		simResetHint(o.ErrOut, on, err)
		if err != nil {
			if res != nil && len(res.GPUs) > 0 {
				_ = printer.Print(o.Out, o.format, applyView{res})
			}
			return err
		}
		if o.dryRun {
			return printer.Print(o.Out, o.format, planView{res.Plan})
		}
		return printer.Print(o.Out, o.format, applyView{res})
	})
}
