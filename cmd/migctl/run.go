package main

import (
	"errors"

	"github.com/spf13/cobra"
)

// Placeholder: replaced by the real command group.
func newRunCmd(s streams) *cobra.Command {
	return &cobra.Command{
		Use:   "run",
		Short: "(not implemented yet)",
		RunE:  func(*cobra.Command, []string) error { return errors.New("run: not implemented yet") },
	}
}
