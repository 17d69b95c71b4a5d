package mig

import (
	"errors"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Sentinel errors. Every error the package returns for one of these
// conditions wraps the sentinel, so callers can use errors.Is.
var (
	// ErrInfeasible: the requested instances cannot be placed on the GPU.
	// The wrapping error is an *InfeasibleError naming the profile that did
	// not fit and the free memory units at that point.
	ErrInfeasible = errors.New("infeasible layout")
	// ErrUnknownProfile: a profile name that is malformed or that the GPU
	// does not offer.
	ErrUnknownProfile = errors.New("unknown profile")
	// ErrBadConfig: malformed YAML or --layout, a device out of range, a
	// count over the maximum, conflicting placements or selections.
	ErrBadConfig = errors.New("bad config")
	// ErrBusy: the change would destroy an instance that has processes and
	// force was not given.
	ErrBusy = errors.New("instance in use")
	// ErrMIGDisabled: the GPU's MIG mode is off (or only pending on), so
	// instances cannot be changed yet.
	ErrMIGDisabled = errors.New("MIG mode disabled")
	// ErrModePending: a MIG mode change is pending; the admin must reset the
	// GPU (or reboot) before instances can be created. migctl never resets.
	ErrModePending = errors.New("MIG mode change pending")
	// ErrNotMIGCapable: the GPU does not support MIG.
	ErrNotMIGCapable = errors.New("GPU not MIG capable")
	// ErrRolledBack: a step failed and the GPU was rolled back to its
	// previous layout.
	ErrRolledBack = errors.New("apply failed and was rolled back")
	// ErrMismatch: assert found a GPU whose layout differs from the request.
	ErrMismatch = errors.New("layout mismatch")
)

// NVMLError is an NVML status code turned into an error at the boundary.
type NVMLError struct {
	Op  string
	Ret nvml.Return
}

func (e *NVMLError) Error() string { return fmt.Sprintf("%s: %s", e.Op, nvml.ErrorString(e.Ret)) }

// Is lets errors.Is(err, nvml.ERROR_IN_USE) work on wrapped NVML errors.
func (e *NVMLError) Is(target error) bool {
	r, ok := target.(nvml.Return)
	return ok && r == e.Ret
}

// nvmlErr returns nil for SUCCESS and an *NVMLError otherwise.
func nvmlErr(op string, ret nvml.Return) error {
	if ret == nvml.SUCCESS {
		return nil
	}
	return &NVMLError{Op: op, Ret: ret}
}
