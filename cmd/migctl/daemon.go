package main

import (
	"errors"

	"github.com/spf13/cobra"
)

// Placeholder: replaced by the real command group.
func newDaemonCmd(s streams) *cobra.Command {
	return &cobra.Command{
		Use:   "daemon",
		Short: "(not implemented yet)",
		RunE:  func(*cobra.Command, []string) error { return errors.New("daemon: not implemented yet") },
	}
}
