package main

import (
	"context"
	"fmt"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/migctl/migctl/internal/printer"
	"github.com/migctl/migctl/mig"
)

type partitionRecoverOptions struct {
	streams
	node nodeFlags
	outputOption
}

func newPartitionRecoverCmd(s streams) *cobra.Command {
	o := &partitionRecoverOptions{streams: s}
	cmd := &cobra.Command{
		Use:   "recover",
		Short: "Finish an apply a crash interrupted (roll forward, else back)",
		Long: `Read the apply journal; if an apply was interrupted (killed, power loss), converge the GPU
it was changing: forward to the journalled target layout, or, if that fails, back to the
journalled previous layout. With no interrupted apply it does nothing. Every apply runs
this first, so it is only needed to repair a node without applying anything new.`,
		Example: `  migctl partition recover --sim h200x8
  sudo migctl partition recover --journal /var/lib/migctl/journal`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.Complete(); err != nil {
				return err
			}
			return o.Run(cmd.Context())
		},
	}
	o.node.add(cmd)
	o.addOutput(cmd)
	return cmd
}

type recoverView struct {
	*mig.RecoverResult `yaml:",inline"`
}

func (v recoverView) Header() []string { return []string{"gpu", "outcome", "layout"} }

func (v recoverView) Rows() [][]string {
	if v.Tx == nil {
		return [][]string{{"-", v.Outcome, ""}}
	}
	return [][]string{{strconv.Itoa(v.Tx.GPU), v.Outcome, v.Layout.String()}}
}

// Run recovers.
func (o *partitionRecoverOptions) Run(ctx context.Context) error {
	return withNode(ctx, &o.node, func(ctx context.Context, on *openedNode) error {
		m, err := on.manager(o.ErrOut)
		if err != nil {
			return err
		}
		res, err := m.Recover(ctx)
		if err != nil {
			return err
		}
		if res.Tx == nil {
			fmt.Fprintf(o.ErrOut, "nothing to recover: no interrupted apply in %s\n", on.journal)
		} else {
			fmt.Fprintf(o.ErrOut, "note: GPUs the interrupted apply had not reached yet are as they were; "+
				"run the same apply again to finish them (what is already right is kept)\n")
		}
		return printer.Print(o.Out, o.format, recoverView{res})
	})
}
