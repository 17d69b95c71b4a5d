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

// outputOption is a command's -o flag. Embedded in an options struct it
// gives the struct its Complete, which parses the flag into format.
type outputOption struct {
	output func() (printer.Format, error)
	format printer.Format
}

// addOutput registers -o/--output on cmd (see outputFlag).
func (o *outputOption) addOutput(cmd *cobra.Command) { o.output = outputFlag(cmd) }

// Complete parses the output format.
func (o *outputOption) Complete() error {
	f, err := o.output()
	o.format = f
	return err
}
