// Command sgd is data-parallel SGD on a small model with the trainer SDK: the
// example `migctl run` launches, and the program behind the test that N ranks
// with batch B/N end with the same weights as one rank with batch B.
//
// The model is a two-layer perceptron (tanh hidden layer, linear output,
// mean squared error) in float64, fitted to a fixed random teacher network on
// synthetic samples that are a pure function of (seed, sample index), so
// every rank can make its share of every global batch without I/O. Each step,
// every rank computes the gradient of its B/N samples, divided by B, and the
// ranks sum their gradients with one all-reduce over the flat parameter
// vector (what DDP does with one bucket). The initial weights are broadcast
// from rank 0.
//
//	migctl run --sim h200x8 --np 7 --profile 1g.18gb -- sgd --steps 200 --batch 56
//	migctl run --gpus 0 --np 7 -- sgd --steps 200 --batch 56 --device-buffers
//
// With --ckpt DIR, rank 0 saves the weights every --ckpt-every steps and
// every rank resumes from the newest checkpoint, so a job that `migctl run`
// restarts after a failure continues where it was. With --out DIR every rank
// writes its final weights to DIR/weights-<rank>.bin (float64, little
// endian) and rank 0 a summary to DIR/summary.json.
package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"time"

	"github.com/migctl/migctl/trainer"
)

// config is the training run.
type config struct {
	Steps     int
	Batch     int // global batch; every rank takes Batch/Size samples
	LR        float64
	Seed      uint64
	In        int
	Hidden    int
	Ckpt      string
	CkptEvery int
	Out       string
	StepDelay time.Duration
	DeviceBuf bool
	LogEvery  int
}

func main() {
	var c config
	flag.IntVar(&c.Steps, "steps", 100, "training steps")
	flag.IntVar(&c.Batch, "batch", 56, "global batch size (a multiple of the number of ranks)")
	flag.Float64Var(&c.LR, "lr", 0.05, "learning rate")
	flag.Uint64Var(&c.Seed, "seed", 1, "seed of the data, the teacher and the initial weights")
	flag.IntVar(&c.In, "in", 16, "input features")
	flag.IntVar(&c.Hidden, "hidden", 32, "hidden units")
	flag.StringVar(&c.Ckpt, "ckpt", "", "checkpoint directory (resume from it after a restart)")
	flag.IntVar(&c.CkptEvery, "ckpt-every", 10, "steps between checkpoints")
	flag.StringVar(&c.Out, "out", "", "write every rank's final weights and rank 0's summary here")
	flag.DurationVar(&c.StepDelay, "step-delay", 0, "sleep this long each step (to make room for a test to kill or swap the job)")
	flag.BoolVar(&c.DeviceBuf, "device-buffers", false, "all-reduce through a buffer on the group's device (device memory on the gpu backend)")
	flag.IntVar(&c.LogEvery, "log-every", 20, "print the loss every this many steps (rank 0)")
	flag.Parse()
	ctx := context.Background()
	g, err := trainer.Init(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sgd:", err)
		os.Exit(1)
	}
	res, err := train(ctx, g, c, os.Stdout)
	if cerr := g.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sgd:", err)
		os.Exit(1)
	}
	if g.Rank() == 0 {
		fmt.Printf("sgd: done: %d ranks, %d steps, final loss %.6g, %d restarts, %s backend, %s\n",
			g.Size(), res.Steps, res.Loss, g.Generation(), g.Backend(), g.Algorithm())
	}
}

// result is what a run ends with.
type result struct {
	Weights []float64 `json:"-"`
	Steps   int       `json:"steps"`
	Loss    float64   `json:"loss"`
	Resumed int       `json:"resumedFrom"`
	Ranks   int       `json:"ranks"`
	Restart int       `json:"restarts"`
}

// train runs c on g and returns the final weights (equal on every rank).
func train(ctx context.Context, g *trainer.Group, c config, log io.Writer) (*result, error) {
	n, r := g.Size(), g.Rank()
	if c.Batch%n != 0 || c.Batch <= 0 {
		return nil, fmt.Errorf("--batch %d is not a positive multiple of the %d ranks", c.Batch, n)
	}
	m := newModel(c.In, c.Hidden)
	teacher := newModel(c.In, c.Hidden)
	teacher.init(c.Seed ^ 0x7ea7c4e2)
	m.init(c.Seed)
	start := 0
	if c.Ckpt != "" {
		step, w, err := loadCheckpoint(c.Ckpt, len(m.w))
		if err != nil {
			return nil, err
		}
		if w != nil {
			start = step
			copy(m.w, w)
		}
	}
	// Every rank starts from rank 0's weights.
	if err := g.Broadcast(ctx, trainer.HostSlice(m.w), trainer.HostSlice(m.w), 0); err != nil {
		return nil, fmt.Errorf("broadcasting the initial weights: %w", err)
	}
	grad := make([]float64, len(m.w))
	var dev trainer.Buffer
	if c.DeviceBuf {
		var err error
		if dev, err = g.Alloc(len(grad), trainer.Float64); err != nil {
			return nil, err
		}
		defer g.Free(dev)
	}
	per := c.Batch / n
	x := make([]float64, c.In)
	lossBuf := make([]float64, 1)
	var loss float64
	for step := start; step < c.Steps; step++ {
		clear(grad)
		lossBuf[0] = 0
		for j := range per {
			idx := uint64(step)*uint64(c.Batch) + uint64(r*per+j)
			sample(c.Seed, idx, x)
			y := teacher.forward(x)
			lossBuf[0] += m.backward(x, y, grad) / float64(c.Batch)
		}
		for i := range grad {
			grad[i] /= float64(c.Batch)
		}
		if err := allReduce(ctx, g, c, grad, dev); err != nil {
			return nil, fmt.Errorf("step %d: %w", step, err)
		}
		if err := g.AllReduce(ctx, trainer.HostSlice(lossBuf), trainer.HostSlice(lossBuf), trainer.Sum); err != nil {
			return nil, fmt.Errorf("step %d: %w", step, err)
		}
		loss = lossBuf[0]
		for i := range m.w {
			m.w[i] -= c.LR * grad[i]
		}
		if r == 0 && c.LogEvery > 0 && (step%c.LogEvery == 0 || step == c.Steps-1) {
			fmt.Fprintf(log, "sgd: step %d loss %.6g\n", step, loss)
		}
		if c.Ckpt != "" && r == 0 && (step+1)%c.CkptEvery == 0 {
			if err := saveCheckpoint(c.Ckpt, step+1, m.w); err != nil {
				return nil, err
			}
		}
		if c.StepDelay > 0 {
			time.Sleep(c.StepDelay)
		}
	}
	res := &result{Weights: m.w, Steps: c.Steps, Loss: loss, Resumed: start, Ranks: n, Restart: g.Generation()}
	if c.Out != "" {
		if err := writeResult(c.Out, r, res); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// allReduce sums grad over the ranks, through a device buffer when asked.
func allReduce(ctx context.Context, g *trainer.Group, c config, grad []float64, dev trainer.Buffer) error {
	if !c.DeviceBuf {
		return g.AllReduce(ctx, trainer.HostSlice(grad), trainer.HostSlice(grad), trainer.Sum)
	}
	host := trainer.HostSlice(grad).Host()
	if err := g.Write(ctx, dev, host); err != nil {
		return err
	}
	if err := g.AllReduce(ctx, dev, dev, trainer.Sum); err != nil {
		return err
	}
	return g.Read(ctx, host, dev)
}

// model is a perceptron with one tanh hidden layer; w holds, in order,
// W1 (hidden×in), b1 (hidden), W2 (hidden), b2 (1).
type model struct {
	in, hidden int
	w          []float64
	h          []float64 // hidden activations of the last forward
}

func newModel(in, hidden int) *model {
	return &model{in: in, hidden: hidden, w: make([]float64, hidden*in+hidden+hidden+1), h: make([]float64, hidden)}
}

func (m *model) init(seed uint64) {
	scale := 1 / math.Sqrt(float64(m.in))
	for i := range m.w {
		m.w[i] = (unit(seed, uint64(i)|1<<62)*2 - 1) * scale
	}
}

func (m *model) forward(x []float64) float64 {
	w1, b1 := m.w[:m.hidden*m.in], m.w[m.hidden*m.in:m.hidden*m.in+m.hidden]
	w2, b2 := m.w[m.hidden*m.in+m.hidden:m.hidden*m.in+2*m.hidden], m.w[len(m.w)-1]
	y := b2
	for k := range m.hidden {
		a := b1[k]
		for i, xi := range x {
			a += w1[k*m.in+i] * xi
		}
		m.h[k] = math.Tanh(a)
		y += w2[k] * m.h[k]
	}
	return y
}

// backward adds the gradient of (f(x)-y)² to grad and returns the loss.
func (m *model) backward(x []float64, y float64, grad []float64) float64 {
	d := m.forward(x) - y
	off1, off2 := m.hidden*m.in, m.hidden*m.in+m.hidden
	w2 := m.w[off2 : off2+m.hidden]
	dy := 2 * d
	grad[len(grad)-1] += dy
	for k := range m.hidden {
		grad[off2+k] += dy * m.h[k]
		da := dy * w2[k] * (1 - m.h[k]*m.h[k])
		grad[off1+k] += da
		for i, xi := range x {
			grad[k*m.in+i] += da * xi
		}
	}
	return d * d
}

// sample fills x with sample idx's inputs in [-1, 1).
func sample(seed, idx uint64, x []float64) {
	for i := range x {
		x[i] = unit(seed, idx*1024+uint64(i))*2 - 1
	}
}

// unit is a number in [0, 1) from (seed, i): splitmix64.
func unit(seed, i uint64) float64 {
	z := seed*0x9e3779b97f4a7c15 + i + 0x632be59bd9b4e019
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	z ^= z >> 31
	return float64(z>>11) / (1 << 53)
}

func float64Bytes(w []float64) []byte {
	b := make([]byte, 8*len(w))
	for i, v := range w {
		binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(v))
	}
	return b
}

func bytesFloat64(b []byte) []float64 {
	w := make([]float64, len(b)/8)
	for i := range w {
		w[i] = math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))
	}
	return w
}

// saveCheckpoint writes step and w atomically (rename).
func saveCheckpoint(dir string, step int, w []float64) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b := binary.LittleEndian.AppendUint64(nil, uint64(step))
	b = append(b, float64Bytes(w)...)
	tmp := filepath.Join(dir, "ckpt.tmp")
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return fmt.Errorf("writing a checkpoint: %w", err)
	}
	return os.Rename(tmp, filepath.Join(dir, "ckpt.bin"))
}

// loadCheckpoint returns the newest checkpoint (nil weights: none yet).
func loadCheckpoint(dir string, n int) (int, []float64, error) {
	b, err := os.ReadFile(filepath.Join(dir, "ckpt.bin"))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil, nil
	}
	if err != nil {
		return 0, nil, fmt.Errorf("reading the checkpoint: %w", err)
	}
	if len(b) != 8+8*n {
		return 0, nil, fmt.Errorf("checkpoint in %s has %d bytes, want %d (another model?)", dir, len(b), 8+8*n)
	}
	return int(binary.LittleEndian.Uint64(b)), bytesFloat64(b[8:]), nil
}

func writeResult(dir string, rank int, res *result) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("weights-%d.bin", rank)), float64Bytes(res.Weights), 0o644); err != nil {
		return err
	}
	if rank != 0 {
		return nil
	}
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "summary.json"), b, 0o644)
}
