package nccl

import "fmt"

// LibraryName is the library Open loads unless EnvLibrary names a file.
const LibraryName = "libnccl.so.2"

// EnvLibrary, when set, is the path Open loads instead of LibraryName (say,
// the libnccl.so.2 inside a PyTorch install: <site-packages>/nvidia/nccl/lib).
const EnvLibrary = "MIGCTL_NCCL_LIB"

// UniqueIDBytes is the size of an ncclUniqueId.
const UniqueIDBytes = 128

// UniqueID is an ncclUniqueId: made by one rank (GetUniqueID), handed to
// every rank of the communicator out of band, passed to CommInitRank.
type UniqueID [UniqueIDBytes]byte

// Comm is an ncclComm_t.
type Comm uintptr

// Stream is a CUstream (cudaStream_t) handle; 0 is the legacy default stream.
type Stream uintptr

// DataType is an ncclDataType_t.
type DataType int

// Data types (ncclDataType_t values).
const (
	Int8     DataType = 0
	Uint8    DataType = 1
	Int32    DataType = 2
	Uint32   DataType = 3
	Int64    DataType = 4
	Uint64   DataType = 5
	Float16  DataType = 6
	Float32  DataType = 7
	Float64  DataType = 8
	BFloat16 DataType = 9 // NCCL 2.10 and later
)

// Size is the size of one element in bytes.
func (d DataType) Size() int {
	switch d {
	case Int8, Uint8:
		return 1
	case Float16, BFloat16:
		return 2
	case Int32, Uint32, Float32:
		return 4
	case Int64, Uint64, Float64:
		return 8
	}
	return 0
}

func (d DataType) String() string {
	names := map[DataType]string{Int8: "int8", Uint8: "uint8", Int32: "int32", Uint32: "uint32", Int64: "int64",
		Uint64: "uint64", Float16: "float16", Float32: "float32", Float64: "float64", BFloat16: "bfloat16"}
	if n, ok := names[d]; ok {
		return n
	}
	return fmt.Sprintf("ncclDataType(%d)", int(d))
}

// RedOp is an ncclRedOp_t.
type RedOp int

// Reduction operators (ncclRedOp_t values).
const (
	Sum  RedOp = 0
	Prod RedOp = 1
	Max  RedOp = 2
	Min  RedOp = 3
	Avg  RedOp = 4 // NCCL 2.10 and later
)

func (o RedOp) String() string {
	switch o {
	case Sum:
		return "sum"
	case Prod:
		return "prod"
	case Max:
		return "max"
	case Min:
		return "min"
	case Avg:
		return "avg"
	}
	return fmt.Sprintf("ncclRedOp(%d)", int(o))
}

// Interface is the part of NCCL migctl uses. Buffers are device addresses
// (the fake's: addresses of host memory registered with its HostMemory);
// counts are elements. Collectives are queued on stream and return at once;
// the result is in recv when the stream has reached that point. In-place
// variants are NCCL's: AllReduce and Broadcast with send == recv,
// AllGather with send == recv + rank·sendCount·size, ReduceScatter with
// send == recv − rank·recvCount·size.
type Interface interface {
	// GetVersion is NCCL's version code (see Version).
	GetVersion() (int, error)
	// GetUniqueID makes the id of a new communicator (one rank calls it).
	GetUniqueID() (UniqueID, error)
	// CommInitRank joins the communicator of id as rank of nranks. It
	// blocks until every rank has joined.
	CommInitRank(nranks int, id UniqueID, rank int) (Comm, error)
	// CommDestroy frees c after its queued work has finished.
	CommDestroy(c Comm) error
	// CommAbort frees c at once, stopping its queued work (the way out of a
	// collective that waits for a dead peer).
	CommAbort(c Comm) error
	// CommGetAsyncError is the error c met while running queued work (nil
	// when none), or the failure of the query itself.
	CommGetAsyncError(c Comm) error
	// GetErrorString is NCCL's text for a status code.
	GetErrorString(r Result) string
	// GetLastError is NCCL's description of the last error on c ("" when
	// the library has none to give).
	GetLastError(c Comm) string

	AllReduce(send, recv uintptr, count int, dt DataType, op RedOp, c Comm, s Stream) error
	AllGather(send, recv uintptr, sendCount int, dt DataType, c Comm, s Stream) error
	ReduceScatter(send, recv uintptr, recvCount int, dt DataType, op RedOp, c Comm, s Stream) error
	Broadcast(send, recv uintptr, count int, dt DataType, root int, c Comm, s Stream) error

	// GroupStart and GroupEnd bracket calls that NCCL issues together.
	GroupStart() error
	GroupEnd() error
}

// Version splits an NCCL version code into major, minor and patch (codes
// from 2.9 on are major·10000 + minor·100 + patch; older ones
// major·1000 + minor·100 + patch).
func Version(code int) (major, minor, patch int) {
	if code >= 20900 {
		return code / 10000, code / 100 % 100, code % 100
	}
	return code / 1000, code % 1000 / 100, code % 100
}

// VersionString is Version as "2.21.5".
func VersionString(code int) string {
	a, b, c := Version(code)
	return fmt.Sprintf("%d.%d.%d", a, b, c)
}
