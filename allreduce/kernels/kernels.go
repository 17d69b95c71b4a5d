package kernels

import _ "embed"

//go:generate bash ../../scripts/gen-ptx.sh

// PTX is the reduction kernels' PTX (reduce.ptx), for cuModuleLoadData.
// Callers must not modify it.
//
//go:embed reduce.ptx
var PTX []byte
