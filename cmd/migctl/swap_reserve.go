package main

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	ctxmgr "github.com/migctl/migctl/context"
	"github.com/migctl/migctl/internal/bytesize"
	"github.com/migctl/migctl/internal/printer"
)

type swapReserveOptions struct {
	conn     *swapConn
	device   string
	size     string
	priority int
	hold     time.Duration
	outputOption

	bytes int64
	s     streams
}

func newSwapReserveCmd(s streams, c *swapConn) *cobra.Command {
	o := &swapReserveOptions{conn: c, s: s}
	cmd := &cobra.Command{
		Use:   "reserve --device DEV --bytes SIZE --priority P",
		Short: "Make room on a device for a job that does not run under the shim",
		Long: `Ask the daemon's policy for SIZE bytes on a device on behalf of a job that is not shimmed
(it cannot be swapped itself, but it can make others go): if the memory is not free, the
daemon swaps out shimmed processes of lower priority than --priority (lowest first, then
most recently started) until it fits, then keeps that memory from its own swap-ins for
--hold, time for the job to allocate it. If nothing can free enough, nothing is swapped
out and the command fails with the reason.

DEV is how the shims name the device: a GPU/MIG UUID or a CUDA ordinal (see
'migctl swap status').`,
		Example: `  migctl swap reserve --device 0 --bytes 40GiB --priority 10 && python serve.py
  migctl swap reserve --device GPU-5d3c... --bytes 16GiB --priority 5 --hold 5m`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.Complete(); err != nil {
				return err
			}
			if err := o.Validate(); err != nil {
				return err
			}
			return o.Run(cmd.Context())
		},
	}
	cmd.Flags().StringVar(&o.device, "device", "0", "device as the shims name it (UUID or ordinal)")
	cmd.Flags().StringVar(&o.size, "bytes", "", "memory to make room for, e.g. 40GiB ("+bytesize.Units+")")
	cmd.Flags().IntVar(&o.priority, "priority", 0, "priority of the job (only lower priorities are swapped out)")
	cmd.Flags().DurationVar(&o.hold, "hold", time.Minute, "how long the freed memory is kept from the daemon's swap-ins")
	o.addOutput(cmd)
	return cmd
}

func (o *swapReserveOptions) Complete() error {
	if err := o.outputOption.Complete(); err != nil {
		return err
	}
	if o.size != "" {
		var err error
		if o.bytes, err = bytesize.Parse(o.size); err != nil {
			return err
		}
	}
	return nil
}

func (o *swapReserveOptions) Validate() error {
	switch {
	case o.bytes <= 0:
		return errors.New("--bytes must be a positive size, e.g. 40GiB")
	case o.device == "":
		return errors.New("--device must not be empty")
	case o.hold <= 0:
		return errors.New("--hold must be positive")
	}
	return nil
}

type reserveView struct {
	Device   string `json:"device" yaml:"device"`
	Bytes    int64  `json:"bytes" yaml:"bytes"`
	FreeWas  int64  `json:"freeBefore" yaml:"freeBefore"`
	Victims  []int  `json:"swappedOut" yaml:"swappedOut"`
	HeldFor  string `json:"heldFor" yaml:"heldFor"`
	Priority int    `json:"priority" yaml:"priority"`
}

func (v reserveView) Header() []string {
	return []string{"device", "bytes", "free-before", "swapped-out", "held-for"}
}

func (v reserveView) Rows() [][]string {
	victims := make([]string, len(v.Victims))
	for i, p := range v.Victims {
		victims[i] = strconv.Itoa(p)
	}
	vs := strings.Join(victims, ",")
	if vs == "" {
		vs = "-"
	}
	return [][]string{{v.Device, ctxmgr.FormatBytes(v.Bytes), ctxmgr.FormatBytes(v.FreeWas), vs, v.HeldFor}}
}

func (o *swapReserveOptions) Run(ctx context.Context) error {
	ctx, cl, done, err := o.conn.connect(ctx)
	if err != nil {
		return err
	}
	defer done()
	r, err := cl.Reserve(ctx, ctxmgr.Request{Device: o.device, Bytes: o.bytes, Priority: o.priority}, o.hold)
	if err != nil {
		return o.conn.explain(err)
	}
	v := reserveView{Device: o.device, Bytes: o.bytes, FreeWas: r.Free, Victims: r.Victims, HeldFor: o.hold.String(), Priority: o.priority}
	return printer.Print(o.s.Out, o.format, v)
}
