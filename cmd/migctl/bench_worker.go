package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/migctl/migctl/internal/benchrank"
)

// benchWorkerOptions are one launched rank's: the spec from the launcher and
// where rank 0 writes the report. Everything else (rank, rendezvous, job
// token) comes from the environment the launcher set, never the command
// line.
type benchWorkerOptions struct {
	specJSON string
	spec     benchrank.Config
	report   string
	streams  streams
}

// newBenchWorkerCmd is the hidden command a bench launcher starts once per
// rank; rank 0 writes the merged report to --report as JSON.
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
	c.Flags().StringVar(&o.report, "report", "", "file rank 0 writes the report to (JSON)")
	return c
}

func (o *benchWorkerOptions) Complete() error {
	if err := json.Unmarshal([]byte(o.specJSON), &o.spec); err != nil {
		return fmt.Errorf("--spec: %w", err)
	}
	return nil
}

func (o *benchWorkerOptions) Validate() error {
	if o.report == "" {
		return errors.New("worker needs --report")
	}
	if os.Getenv("MIGCTL_RDZV_ADDR") == "" || os.Getenv("MIGCTL_JOB_TOKEN") == "" {
		return errors.New("bench worker: no MIGCTL_RDZV_ADDR / MIGCTL_JOB_TOKEN in the environment; it is started by 'migctl bench', not by hand")
	}
	return nil
}

func (o *benchWorkerOptions) Run(cmd *cobra.Command) error {
	rep, err := runRank(cmd.Context(), o.spec, "", "", -1, o.streams.ErrOut)
	if err != nil {
		return err
	}
	if rep == nil {
		return nil
	}
	b, err := json.Marshal(rep)
	if err != nil {
		return err
	}
	return os.WriteFile(o.report, b, 0o600)
}
