package launcher

import (
	"os"
	"strconv"
)

// The worker environment (the team's contract; trainer.Init reads the
// MIGCTL_* ones, PyTorch's env:// init the torchrun ones).
const (
	EnvRank           = "RANK"
	EnvWorldSize      = "WORLD_SIZE"
	EnvLocalRank      = "LOCAL_RANK"
	EnvLocalWorldSize = "LOCAL_WORLD_SIZE"
	EnvGroupRank      = "GROUP_RANK"
	EnvGroupWorldSize = "GROUP_WORLD_SIZE"
	EnvRoleRank       = "ROLE_RANK"
	EnvRoleWorldSize  = "ROLE_WORLD_SIZE"
	EnvMasterAddr     = "MASTER_ADDR"
	EnvMasterPort     = "MASTER_PORT"
	EnvRestartCount   = "TORCHELASTIC_RESTART_COUNT"
	EnvMaxRestarts    = "TORCHELASTIC_MAX_RESTARTS"
	EnvRunID          = "TORCHELASTIC_RUN_ID"
	EnvErrorFile      = "TORCHELASTIC_ERROR_FILE"
	EnvVisibleDevices = "CUDA_VISIBLE_DEVICES"

	EnvRdzvAddr   = "MIGCTL_RDZV_ADDR"
	EnvJobToken   = "MIGCTL_JOB_TOKEN"
	EnvJob        = "MIGCTL_JOB"
	EnvGeneration = "MIGCTL_GENERATION"
	EnvBackend    = "MIGCTL_BACKEND"
	EnvDevice     = "MIGCTL_DEVICE"
	EnvTimeout    = "MIGCTL_TIMEOUT"
	EnvSocket     = "MIGCTL_SOCKET"

	EnvSwapSocket   = "MIGSWAP_SOCKET"
	EnvSwapJob      = "MIGSWAP_JOB"
	EnvSwapPriority = "MIGSWAP_PRIORITY"
	EnvPreload      = "LD_PRELOAD"
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
	return append(out, c.Env...)
}
