package main

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"
)

// benchWorkerOptions are one launched rank's: the spec from the launcher,
// and where to meet the others.
type benchWorkerOptions struct {
	specJSON string
	spec     benchSpec
	addr     string
	token    string
	rank     int
	streams  streams
}

// newBenchWorkerCmd is the hidden command a bench launcher starts once per
// rank; rank 0 writes the merged report to stdout as JSON.
func newBenchWorkerCmd(s streams) *cobra.Command {
	o := &benchWorkerOptions{streams: s}
	c := &cobra.Command{
		Use:    "worker",
		Short:  "One rank of a benchmark (started by migctl bench)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.Complete(); err != nil {
				return err
			}
			if err := o.Validate(); err != nil {
				return err
			}
			return o.Run(cmd)
		},
	}
	c.Flags().StringVar(&o.specJSON, "spec", "", "benchmark spec (JSON)")
	c.Flags().StringVar(&o.addr, "rendezvous", "", "rendezvous address")
	c.Flags().StringVar(&o.token, "token", "", "job token")
	c.Flags().IntVar(&o.rank, "rank", -1, "rank")
	return c
}

func (o *benchWorkerOptions) Complete() error {
	if err := json.Unmarshal([]byte(o.specJSON), &o.spec); err != nil {
		return fmt.Errorf("--spec: %w", err)
	}
	return nil
}

func (o *benchWorkerOptions) Validate() error {
	if o.addr == "" || o.token == "" {
		return fmt.Errorf("worker needs --rendezvous and --token")
	}
	return nil
}

func (o *benchWorkerOptions) Run(cmd *cobra.Command) error {
	rep, err := runRank(cmd.Context(), o.spec, o.addr, o.token, o.rank, o.streams.ErrOut)
	if err != nil {
		return err
	}
	if rep == nil {
		return nil
	}
	return json.NewEncoder(o.streams.Out).Encode(rep)
}
