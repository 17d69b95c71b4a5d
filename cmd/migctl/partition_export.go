package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"

	"github.com/migctl/migctl/mig"
)

type partitionExportOptions struct {
	streams
	node      nodeFlags
	gpus      string
	name      string
	migParted bool
	output    string
}

func newPartitionExportCmd(s streams) *cobra.Command {
	o := &partitionExportOptions{streams: s}
	cmd := &cobra.Command{
		Use:   "export",
		Short: "Write the current layout as mig-parted v1 YAML, with placements",
		Long: `Write the node's current layout as a mig-parted v1 file with one configuration (--name).
GPUs with the same layout share an entry; GPUs with MIG off get 'mig-enabled: false'.

By default the file carries migctl's mig-placements extension, which records where each GPU
instance sits, so 'migctl partition apply -f' of the output reproduces the layout exactly,
placements and all. mig-parted refuses keys it does not know: for a file that
nvidia-mig-parted applies, add --mig-parted (no placements; the same instances, placed by
whoever applies it).

-o yaml (default) writes the file; -o json writes the same document as JSON, which
mig-parted and migctl also read.`,
		Example: `  # save the layout, and reproduce it exactly on another node
  migctl partition export --sim h200x8 > layout.yaml
  migctl partition apply --sim h200x8 -f layout.yaml -c current

  # a file for nvidia-mig-parted, for two GPUs, under the name 'training'
  sudo migctl partition export --gpus 0,1 --name training --mig-parted > training.yaml
  sudo nvidia-mig-parted apply -f training.yaml -c training`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.Validate(); err != nil {
				return err
			}
			return o.Run(cmd.Context())
		},
	}
	o.node.add(cmd)
	gpusFlag(cmd, &o.gpus, "GPUs to export")
	cmd.Flags().StringVar(&o.name, "name", "current", "configuration name in the written file")
	cmd.Flags().BoolVar(&o.migParted, "mig-parted", false, "strict mig-parted v1: leave out mig-placements, which nvidia-mig-parted refuses")
	cmd.Flags().StringVarP(&o.output, "output", "o", "yaml", "output format: yaml (the mig-parted file) or json (the same document)")
	return cmd
}

// Validate checks the configuration name and the output format.
func (o *partitionExportOptions) Validate() error {
	if o.name == "" {
		return errEmptyName
	}
	switch o.output {
	case "yaml", "json":
	case "table":
		return errors.New("export writes a mig-parted file: -o yaml (default) or -o json; 'migctl partition show' prints a table")
	default:
		return fmt.Errorf("unknown output format %q for export (want yaml or json)", o.output)
	}
	return nil
}

// Run exports.
func (o *partitionExportOptions) Run(ctx context.Context) error {
	return withNode(ctx, &o.node, func(ctx context.Context, on *openedNode) error {
		node, gpus, err := on.discover(o.gpus)
		if err != nil {
			return err
		}
		b, err := mig.ExportWith(node, o.name, gpus, mig.ExportOptions{MigParted: o.migParted})
		if err != nil {
			return err
		}
		if o.output == "json" {
			if b, err = yamlToJSON(b); err != nil {
				return err
			}
		}
		_, err = o.Out.Write(b)
		return err
	})
}

// yamlToJSON re-encodes an exported document as indented JSON.
func yamlToJSON(b []byte) ([]byte, error) {
	var doc any
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("re-reading the export: %w", err)
	}
	out, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encoding the export as JSON: %w", err)
	}
	return append(out, '\n'), nil
}
