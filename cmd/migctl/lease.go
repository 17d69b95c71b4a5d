package main

import (
	"context"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	ctxmgr "github.com/migctl/migctl/context"
)

// leaseConn are the flags every lease subcommand shares: where the daemon is
// and how long to wait for it.
type leaseConn struct {
	socket  string
	timeout time.Duration
}

func newLeaseCmd(s streams) *cobra.Command {
	c := &leaseConn{}
	cmd := &cobra.Command{
		Use:   "lease",
		Short: "List, acquire and release the MIG devices the daemon leases to jobs",
		Long: `Talk to 'migctl daemon' on its control socket about MIG device leases.

A lease gives one MIG device (its MIG-... UUID is what CUDA_VISIBLE_DEVICES takes) to a job.
'acquire' asks for COUNT devices of a profile, all or nothing: free devices first, and when
too few are free the daemon creates more by repartitioning capacity nobody leases or uses
(it never destroys a leased or busy device). When even that cannot fit the request, the
error says what is leased, by which job, and what would have to go.

A lease lasts until 'migctl lease release', or, with --pid, until that process exits.
'migctl run' takes and releases its leases itself.`,
		Example: `  # no GPU? start a daemon on a simulated node first: migctl daemon --sim h200x8
  migctl lease acquire --job train --profile 1g.18gb --count 7
  migctl lease list
  migctl lease list -o json | jq -r '.leases[].uuid'
  migctl lease release --job train`,
	}
	cmd.PersistentFlags().StringVar(&c.socket, "socket", ctxmgr.DefaultControlSocket(), "the daemon's control socket (env "+envControlSocket+")")
	cmd.PersistentFlags().DurationVar(&c.timeout, "timeout", 5*time.Minute, "give up waiting for the daemon after this long")
	cmd.AddCommand(newLeaseListCmd(s, c), newLeaseAcquireCmd(s, c), newLeaseReleaseCmd(s, c))
	return cmd
}

// connect dials the daemon with a context bounded by --timeout; done closes
// the connection and releases the context.
func (c *leaseConn) connect(ctx context.Context) (context.Context, *ctxmgr.Client, func(), error) {
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	cl, err := ctxmgr.Dial(ctx, c.socket)
	if err != nil {
		cancel()
		return nil, nil, nil, err
	}
	return ctx, cl, func() { cl.Close(); cancel() }, nil
}

// leaseView is what the lease commands print: a table of leases, or JSON /
// YAML with the leases under "leases".
type leaseView struct {
	Leases []ctxmgr.Lease `json:"leases" yaml:"leases"`
}

func (v leaseView) Header() []string {
	return []string{"job", "uuid", "gpu", "profile", "placement", "gi", "ci", "pid", "created", "since"}
}

func (v leaseView) Rows() [][]string {
	rows := make([][]string, 0, len(v.Leases))
	for _, le := range v.Leases {
		pid := "-"
		if le.PID != 0 {
			pid = strconv.Itoa(le.PID)
		}
		created := ""
		if le.Created {
			created = "created"
		}
		rows = append(rows, []string{le.Job, le.UUID, strconv.Itoa(le.GPU), le.Profile, le.Placement.String(),
			strconv.Itoa(le.GIID), strconv.Itoa(le.CIID), pid, created, le.Since.Local().Format(time.DateTime)})
	}
	return rows
}

func newLeaseView(ls []ctxmgr.Lease) leaseView {
	if ls == nil {
		ls = []ctxmgr.Lease{}
	}
	return leaseView{Leases: ls}
}
