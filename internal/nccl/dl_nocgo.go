//go:build !cgo

package nccl

// Open always fails in a build without cgo: NCCL cannot be loaded.
func Open() (Interface, error) {
	return nil, notFound(LibraryName, "built without cgo")
}
