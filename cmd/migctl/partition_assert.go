package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/migctl/migctl/internal/printer"
	"github.com/migctl/migctl/mig"
)

type partitionAssertOptions struct {
	streams
	node   nodeFlags
	target targetFlags
	outputOption
}

func newPartitionAssertCmd(s streams) *cobra.Command {
	o := &partitionAssertOptions{streams: s}
	cmd := &cobra.Command{
		Use:   "assert",
		Short: "Check that the GPUs have a layout; exit non-zero with the reason if not",
		Long: `Check, without changing anything, that every selected GPU has the layout: MIG mode, the
number of MIG devices of each profile, and any pinned placements (PROFILE@START or
mig-placements). Exit 0 when all match; otherwise exit 1 with a one-line reason naming
each GPU that differs.`,
		Example: `  migctl partition assert --sim h200x8 --gpus all --layout '3g.71gb=1,2g.35gb=1,1g.18gb=1'
  migctl partition assert -f layout.yaml -c balanced && echo layout in place`,
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
	o.addOutput(cmd)
	return cmd
}

// Validate checks the flag combination and reads -f.
func (o *partitionAssertOptions) Validate() error { return o.target.validate(o.In) }

type assertRow struct {
	GPU    int    `json:"gpu" yaml:"gpu"`
	OK     bool   `json:"ok" yaml:"ok"`
	Layout string `json:"layout" yaml:"layout"`
	Reason string `json:"reason,omitempty" yaml:"reason,omitempty"`
}

type assertView struct {
	GPUs []assertRow `json:"gpus" yaml:"gpus"`
}

func (v assertView) Header() []string { return []string{"gpu", "ok", "layout", "reason"} }

func (v assertView) Rows() [][]string {
	var rows [][]string
	for _, r := range v.GPUs {
		rows = append(rows, []string{strconv.Itoa(r.GPU), strconv.FormatBool(r.OK), r.Layout, r.Reason})
	}
	return rows
}

// Run asserts.
func (o *partitionAssertOptions) Run(ctx context.Context) error {
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
		var v assertView
		var bad []string
		for _, i := range slices.Sorted(maps.Keys(reqs)) {
			g := &node.GPUs[i]
			r := assertRow{GPU: i, OK: true, Layout: g.Layout().String()}
			if !g.MIGEnabled {
				r.Layout = "MIG disabled"
				if g.MIGPending {
					r.Layout += " (pending enabled)"
				}
			}
			if err := mig.Assert(g, reqs[i]); err != nil {
				if !errors.Is(err, mig.ErrMismatch) {
					return err
				}
				r.OK, r.Reason = false, err.Error()
				bad = append(bad, strings.TrimPrefix(err.Error(), mig.ErrMismatch.Error()+": "))
			}
			v.GPUs = append(v.GPUs, r)
		}
		if err := printer.Print(o.Out, o.format, v); err != nil {
			return err
		}
		if len(bad) > 0 {
			return fmt.Errorf("%w: %s", mig.ErrMismatch, strings.Join(bad, "; "))
		}
		return nil
	})
}
