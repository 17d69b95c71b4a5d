package supervisor

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
)

// Tee says which of a worker's streams go to the console when LogDir is set
// (torchrun's --tee: 0 none, 1 stdout, 2 stderr, 3 both).
type Tee uint8

// Tee values; they combine as bits.
const (
	TeeNone   Tee = 0
	TeeStdout Tee = 1
	TeeStderr Tee = 2
	TeeAll    Tee = TeeStdout | TeeStderr
)

// ParseTee reads a --tee value: none|stdout|stderr|all (or torchrun's 0..3).
func ParseTee(s string) (Tee, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "none", "0":
		return TeeNone, nil
	case "stdout", "out", "1":
		return TeeStdout, nil
	case "stderr", "err", "2":
		return TeeStderr, nil
	case "all", "both", "3":
		return TeeAll, nil
	}
	return 0, fmt.Errorf("--tee %q: want none, stdout, stderr or all (or 0..3 as torchrun)", s)
}

func (t Tee) String() string {
	return [...]string{"none", "stdout", "stderr", "all"}[t&TeeAll]
}

// maxLine is the longest piece of a line written at once; a longer line is
// cut into pieces of this size, each written whole with its prefix.
const maxLine = 64 << 10

// console serialises writes of whole lines to the supervisor's stdout and
// stderr: one mutex for both, so two ranks' lines never mix on a terminal
// that shows both streams.
type console struct {
	mu     sync.Mutex
	out    io.Writer
	errOut io.Writer
}

func (c *console) write(w io.Writer, b []byte) {
	if w == nil {
		return
	}
	c.mu.Lock()
	_, _ = w.Write(b)
	c.mu.Unlock()
}

// stream copies one pipe of one worker, line by line, to the console (with
// the prefix) and to a log file (without it).
type stream struct {
	r       *os.File
	con     *console
	dst     io.Writer // console stream, nil when not shown
	prefix  string
	file    *os.File // nil without LogDir
	done    chan struct{}
	lineBuf []byte
}

// copy reads until EOF (every writer closed) or until the read end is
// closed under it.
func (s *stream) copy() {
	defer close(s.done)
	br := bufio.NewReaderSize(s.r, maxLine)
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 {
			s.emit(line)
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			return
		}
	}
}

func (s *stream) emit(line []byte) {
	if s.file != nil {
		_, _ = s.file.Write(line)
		if line[len(line)-1] != '\n' && len(line) < maxLine {
			_, _ = s.file.Write([]byte{'\n'})
		}
	}
	if s.dst == nil {
		return
	}
	b := append(s.lineBuf[:0], s.prefix...)
	b = append(b, line...)
	if b[len(b)-1] != '\n' {
		b = append(b, '\n')
	}
	s.lineBuf = b
	s.con.write(s.dst, b)
}
