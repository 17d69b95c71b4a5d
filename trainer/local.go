package trainer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"

	"github.com/migctl/migctl/comm/rendezvous"
)

// RunLocal runs body on n ranks that are goroutines of this process, each
// with its own Group (host backend unless opts say otherwise), meeting at a
// rendezvous hosted here on a private socket, with shared memory in a
// private directory. It returns when every rank has returned, with every
// rank's error joined. For tests, examples and trying the SDK without a
// launcher; a real job runs one process per rank under `migctl run`.
func RunLocal(ctx context.Context, n int, body func(g *Group) error, opts ...Option) error {
	return runLocal(ctx, n, func(int) []Option { return opts }, body)
}

func runLocal(ctx context.Context, n int, perRank func(rank int) []Option, body func(g *Group) error) error {
	if n < 1 {
		return fmt.Errorf("RunLocal with %d ranks: want at least 1", n)
	}
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return err
	}
	token := hex.EncodeToString(b)
	srv, err := rendezvous.NewServer(token, n)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "migctl-local-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "rdzv.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		return fmt.Errorf("listening for the local rendezvous: %w", err)
	}
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := []Option{WithRendezvous("unix://"+sock, token), WithRank(r, n), WithShmRoot(dir),
				WithJob("local"), WithBackend(BackendHost)}
			o = append(o, perRank(r)...)
			g, err := Init(ctx, o...)
			if err != nil {
				errs[r] = err
				return
			}
			err = body(g)
			if err != nil {
				g.Abort(err.Error()) // release the others now, not at their deadline
			}
			errs[r] = errors.Join(err, g.Close())
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
