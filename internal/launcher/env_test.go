package launcher

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/trainer"
)

// TestEnvNamesMatchTheSDK: what the launcher sets is what trainer.Init
// reads (two lists of the same contract must not drift apart).
func TestEnvNamesMatchTheSDK(t *testing.T) {
	for launcherName, sdkName := range map[string]string{
		EnvRank: trainer.EnvRank, EnvWorldSize: trainer.EnvWorldSize, EnvLocalRank: trainer.EnvLocalRank,
		EnvLocalWorldSize: trainer.EnvLocalWorldSize, EnvGroupRank: trainer.EnvGroupRank,
		EnvGroupWorldSize: trainer.EnvGroupWorldSize, EnvRestartCount: trainer.EnvRestartCount,
		EnvRdzvAddr: trainer.EnvRendezvous, EnvJobToken: trainer.EnvToken, EnvJob: trainer.EnvJob,
		EnvGeneration: trainer.EnvGeneration, EnvBackend: trainer.EnvBackend, EnvDevice: trainer.EnvDevice,
		EnvTimeout: trainer.EnvTimeout, EnvSocket: trainer.EnvSocket, EnvSwapSocket: trainer.EnvSwapSocket,
		EnvSwapJob: trainer.EnvSwapJob, EnvSwapPriority: trainer.EnvSwapPriority,
	} {
		require.Equal(t, sdkName, launcherName)
	}
}
