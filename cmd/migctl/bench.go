package main

import (
	"errors"

	"github.com/spf13/cobra"
)

// Placeholder: replaced by the real command group.
func newBenchCmd(s streams) *cobra.Command {
	return &cobra.Command{
		Use:   "bench",
		Short: "(not implemented yet)",
		RunE:  func(*cobra.Command, []string) error { return errors.New("bench: not implemented yet") },
	}
}
