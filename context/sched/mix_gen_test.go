package sched

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

// envWriteMix regenerates testdata/jobmix.json from genMix (the recorded
// mix; regenerating it changes the numbers in docs/daemon.md too).
const envWriteMix = "MIGCTL_WRITE_JOBMIX"

const mixPath = "testdata/jobmix.json"

// mixDescription says where the recorded mix's shape comes from.
const mixDescription = "Synthetic, seeded (genMix in mix_gen_test.go, seed 10): 40 jobs arriving at one H200 (140 GiB usable) " +
	"over about 100 minutes, Poisson arrivals (mean gap 150 s). Shape after Salus (Yu & Chowdhury, MLSys 2020), whose policies " +
	"were evaluated on a mix of short inference-like jobs and long training jobs, and after the heavy-tailed job durations " +
	"that published GPU-cluster traces report (most jobs short, a few long: Jeon et al., ATC 2019, Microsoft's Philly): " +
	"24 inference-like jobs (log-normal duration, median 60 s, 15-300 s; 8-24 GiB; 20-50% of the GPU's compute; every fourth " +
	"at priority 10, latency-critical), 16 training jobs (log-normal, median 10 min, 4-40 min; 30-90 GiB; 80-100% of the " +
	"compute). Every inference-like job and 12 of 16 training jobs declare their duration (srf uses it); the others do not. " +
	"Sizes are typical of models that run on one H200, not measured jobs."

// genMix builds the recorded mix.
func genMix() Mix { return genMixWith(10) }

// genMixWith builds a mix of the recorded mix's shape from seed.
func genMixWith(seed uint64) Mix {
	r := rand.New(rand.NewPCG(seed, seed))
	logNormal := func(median, sigma, lo, hi float64) float64 {
		return math.Min(hi, math.Max(lo, median*math.Exp(sigma*r.NormFloat64())))
	}
	uniform := func(lo, hi float64) float64 { return lo + (hi-lo)*r.Float64() }
	round := func(x, step float64) float64 { inv := math.Round(1 / step); return math.Round(x*inv) / inv }
	kinds := make([]string, 0, 40)
	for range 24 {
		kinds = append(kinds, "inference")
	}
	for range 16 {
		kinds = append(kinds, "training")
	}
	r.Shuffle(len(kinds), func(i, j int) { kinds[i], kinds[j] = kinds[j], kinds[i] })
	m := Mix{Description: mixDescription, Device: MixDevice{Name: "H200 (MIG off)", MemoryGiB: 140}}
	t := 0.0
	inf, train := 0, 0
	for i, k := range kinds {
		j := MixJob{ID: i + 1, Kind: k, ArrivalS: round(t, 0.1)}
		switch k {
		case "inference":
			inf++
			j.Name = "infer-" + itoa(inf)
			j.DurationS = round(logNormal(60, 0.8, 15, 300), 1)
			j.MemoryGiB = round(uniform(8, 24), 0.5)
			j.Compute = round(uniform(0.2, 0.5), 0.05)
			j.Declares = true
			if inf%4 == 0 {
				j.Priority = 10
			}
		default:
			train++
			j.Name = "train-" + itoa(train)
			j.DurationS = round(logNormal(600, 0.6, 240, 2400), 1)
			j.MemoryGiB = round(uniform(30, 90), 0.5)
			j.Compute = round(uniform(0.8, 1.0), 0.05)
			j.Declares = train%4 != 0
		}
		m.Jobs = append(m.Jobs, j)
		t += r.ExpFloat64() * 150
	}
	return m
}

func itoa(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}

func TestRecordedMixIsGenMix(t *testing.T) {
	want := genMix()
	require.NoError(t, want.Validate())
	if os.Getenv(envWriteMix) == "1" {
		b, err := json.MarshalIndent(want, "", "  ")
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(mixPath, append(b, '\n'), 0o644))
	}
	got, err := LoadMix(mixPath)
	require.NoError(t, err, "regenerate with %s=1 go test -run RecordedMix ./context/sched", envWriteMix)
	require.Equal(t, want, got, "testdata/jobmix.json is not genMix's output: regenerate with %s=1", envWriteMix)
}
