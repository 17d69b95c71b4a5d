package main

import (
	"errors"

	"github.com/spf13/cobra"
)

// Placeholder: replaced by the real command group.
func newSwapCmd(s streams) *cobra.Command {
	return &cobra.Command{
		Use:   "swap",
		Short: "(not implemented yet)",
		RunE:  func(*cobra.Command, []string) error { return errors.New("swap: not implemented yet") },
	}
}
