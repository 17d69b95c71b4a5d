package main

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	ctxmgr "github.com/migctl/migctl/context"
	"github.com/migctl/migctl/mig"
	"github.com/migctl/migctl/mig/migsim"
)

// simSource is a MIG source over the simulated node the flags name: it
// opens the node for each call (so 'migctl partition ... --sim' can use it
// meanwhile) and journals applies where 'partition apply --sim' does. It
// opens the node once first, so a bad --sim fails here. Returns the model too
// (its memory is the default --gpu-memory).
func simSource(f *nodeFlags) (*ctxmgr.ReopeningSource, migsim.Model, error) {
	on, err := f.open()
	if err != nil {
		return nil, migsim.Model{}, err
	}
	journal := on.journal
	model := on.sim.Model()
	on.close()
	return ctxmgr.NewReopeningSource(func() (nvml.Interface, func(), error) {
		on, err := f.open()
		if err != nil {
			return nil, nil, err
		}
		return on.lib, on.close, nil
	}, mig.WithJournal(journal)), model, nil
}

func nvmlError(lib nvml.Interface, ret nvml.Return) (s string) {
	defer func() {
		if recover() != nil { // ErrorString needs the library loaded
			s = fmt.Sprintf("NVML return %d", int(ret))
		}
	}()
	return lib.ErrorString(ret)
}
