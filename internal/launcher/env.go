package launcher

import (
	"os"
	"strconv"

	"github.com/migctl/migctl/trainer"
)

// The worker environment: the names trainer.Init reads are the trainer's
// (one definition); the others are torchrun's, read by PyTorch's env://
// init and torch.distributed.elastic.
const (
	EnvRank           = trainer.EnvRank
	EnvWorldSize      = trainer.EnvWorldSize
	EnvLocalRank      = trainer.EnvLocalRank
	EnvLocalWorldSize = trainer.EnvLocalWorldSize
	EnvGroupRank      = trainer.EnvGroupRank
	EnvGroupWorldSize = trainer.EnvGroupWorldSize
	EnvRestartCount   = trainer.EnvRestartCount
	EnvRdzvAddr       = trainer.EnvRendezvous
	EnvJobToken       = trainer.EnvToken
	EnvJob            = trainer.EnvJob
	EnvGeneration     = trainer.EnvGeneration
	EnvBackend        = trainer.EnvBackend
	EnvDevice         = trainer.EnvDevice
	EnvTimeout        = trainer.EnvTimeout
	EnvSocket         = trainer.EnvSocket
	EnvSwapSocket     = trainer.EnvSwapSocket
	EnvSwapJob        = trainer.EnvSwapJob
	EnvSwapPriority   = trainer.EnvSwapPriority
	EnvShmRoot        = trainer.EnvShmRoot

	EnvRoleRank       = "ROLE_RANK"
	EnvRoleWorldSize  = "ROLE_WORLD_SIZE"
	EnvMasterAddr     = "MASTER_ADDR"
	EnvMasterPort     = "MASTER_PORT"
	EnvMaxRestarts    = "TORCHELASTIC_MAX_RESTARTS"
	EnvRunID          = "TORCHELASTIC_RUN_ID"
	EnvErrorFile      = "TORCHELASTIC_ERROR_FILE"
	EnvVisibleDevices = "CUDA_VISIBLE_DEVICES"
	EnvPreload        = "LD_PRELOAD"
	EnvOMPThreads     = "OMP_NUM_THREADS"
)

// workerEnv is what one worker's environment adds to the launcher's.
type workerEnv struct {
	rank, local, gen int
	plan             *plan
	dev              *Device
}

func (e workerEnv) list() []string {
	p := e.plan
	c := p.cfg
	kv := func(k string, v any) string {
		switch x := v.(type) {
		case int:
			return k + "=" + strconv.Itoa(x)
		case string:
			return k + "=" + x
		}
		panic("workerEnv: bad value type")
	}
	out := []string{
		kv(EnvRank, e.rank), kv(EnvWorldSize, p.world),
		kv(EnvLocalRank, e.local), kv(EnvLocalWorldSize, c.NProc),
		kv(EnvGroupRank, c.NodeRank), kv(EnvGroupWorldSize, c.NNodes),
		kv(EnvRoleRank, e.rank), kv(EnvRoleWorldSize, p.world),
		kv(EnvMasterAddr, p.masterAddr), kv(EnvMasterPort, p.masterPort),
		kv(EnvRestartCount, e.gen), kv(EnvMaxRestarts, c.MaxRestarts),
		kv(EnvRunID, c.Job),
		kv(EnvRdzvAddr, p.rdzvAddr), kv(EnvJobToken, c.Token), kv(EnvJob, c.Job),
		kv(EnvGeneration, e.gen), kv(EnvBackend, c.Backend), kv(EnvTimeout, c.Timeout.String()),
	}
	ord := 0
	if e.dev != nil {
		out = append(out, kv(EnvVisibleDevices, e.dev.Visible))
		ord = e.dev.Ordinal
	}
	out = append(out, kv(EnvDevice, ord))
	if c.DaemonSocket != "" {
		out = append(out, kv(EnvSocket, c.DaemonSocket))
	}
	if c.ShmRoot != "" {
		out = append(out, kv(EnvShmRoot, c.ShmRoot))
	}
	if s := c.Swap; s != nil {
		pre := s.Library
		if old := os.Getenv(EnvPreload); old != "" {
			pre += ":" + old
		}
		out = append(out, kv(EnvPreload, pre), kv(EnvSwapJob, c.Job), kv(EnvSwapPriority, s.Priority))
		if s.Socket != "" {
			out = append(out, kv(EnvSwapSocket, s.Socket))
		}
	}
	// Several workers on one host each start a full set of OpenMP threads
	// (PyTorch's CPU ops): 7 workers on 16 cores make 112 spinning threads
	// that starve each other and the collectives' reduce threads. Like
	// torchrun, one thread each unless the user chose (environment or --env).
	if c.NProc > 1 && os.Getenv(EnvOMPThreads) == "" {
		out = append(out, kv(EnvOMPThreads, "1"))
	}
	return append(out, c.Env...)
}
