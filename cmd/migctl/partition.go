package main

import (
	"errors"

	"github.com/spf13/cobra"
)

// Placeholder: replaced by the real command group.
func newPartitionCmd(s streams) *cobra.Command {
	return &cobra.Command{
		Use:   "partition",
		Short: "(not implemented yet)",
		RunE:  func(*cobra.Command, []string) error { return errors.New("partition: not implemented yet") },
	}
}
