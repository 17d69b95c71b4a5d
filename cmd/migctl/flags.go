package main

import (
	"github.com/spf13/cobra"

	"github.com/migctl/migctl/internal/printer"
)

// outputFlag registers -o/--output on cmd and returns a function that parses it.
func outputFlag(cmd *cobra.Command) func() (printer.Format, error) {
	var v string
	cmd.Flags().StringVarP(&v, "output", "o", "table", "output format: table|json|yaml")
	return func() (printer.Format, error) { return printer.ParseFormat(v) }
}
