package main

import (
	"context"

	"github.com/spf13/cobra"

	"github.com/migctl/migctl/mig"
)

type partitionExportOptions struct {
	streams
	node nodeFlags
	gpus string
	name string
}

func newPartitionExportCmd(s streams) *cobra.Command {
	o := &partitionExportOptions{streams: s}
	cmd := &cobra.Command{
		Use:   "export",
		Short: "Write the current layout as mig-parted v1 YAML, with placements",
		Long: `Write the node's current layout as a mig-parted v1 file with one configuration (--name).
GPUs with the same layout share an entry. migctl's mig-placements extension records where
each GPU instance sits, so 'migctl partition apply -f' of the output reproduces the layout
exactly; mig-parted itself reads the file too (placements aside).`,
		Example: `  migctl partition export --sim h200x8 > layout.yaml
  migctl partition apply --sim h200x8 -f layout.yaml -c current
  sudo migctl partition export --gpus 0,1 --name training`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.Validate(); err != nil {
				return err
			}
			return o.Run(cmd.Context())
		},
	}
	o.node.add(cmd)
	cmd.Flags().StringVar(&o.gpus, "gpus", "", "GPUs to export: 'all' (default) or indices, UUIDs or PCI bus ids")
	cmd.Flags().StringVar(&o.name, "name", "current", "configuration name in the written file")
	return cmd
}

// Validate checks the configuration name.
func (o *partitionExportOptions) Validate() error {
	if o.name == "" {
		return errEmptyName
	}
	return nil
}

// Run exports.
func (o *partitionExportOptions) Run(ctx context.Context) error {
	return withNode(ctx, &o.node, func(ctx context.Context, on *openedNode) error {
		node, err := mig.Discover(on.lib)
		if err != nil {
			return err
		}
		gpus, err := mig.SelectGPUs(o.gpus, node)
		if err != nil {
			return err
		}
		b, err := mig.Export(node, o.name, gpus)
		if err != nil {
			return err
		}
		_, err = o.Out.Write(b)
		return err
	})
}
