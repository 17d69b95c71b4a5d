//go:build !cgo

package cuda

import "fmt"

// LibraryName is the driver library Open loads.
const LibraryName = "libcuda.so.1"

// Open always fails in a build without cgo: the driver cannot be loaded.
func Open() (Interface, error) {
	return nil, fmt.Errorf("%w: built without cgo", ErrLibraryNotFound)
}
