package swapproto

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"sync"
)

// Reader reads messages from a stream. Not safe for concurrent use.
type Reader struct {
	br *bufio.Reader
}

// NewReader returns a Reader over r.
func NewReader(r io.Reader) *Reader {
	return &Reader{br: bufio.NewReaderSize(r, MaxLine+2)}
}

// Read blocks until a full line arrives and decodes it. It returns io.EOF at
// a clean end of stream, ErrLineTooLong (the line was skipped) or a wrapped
// ErrMalformed (the line was consumed) for bad input: the caller may go on
// reading after either; any other error is the stream's.
func (r *Reader) Read() (Message, error) {
	line, err := r.br.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		for errors.Is(err, bufio.ErrBufferFull) {
			_, err = r.br.ReadSlice('\n')
		}
		if err != nil {
			return Message{}, err
		}
		return Message{}, ErrLineTooLong
	}
	if err != nil {
		if errors.Is(err, io.EOF) && len(line) > 0 {
			return Message{}, io.ErrUnexpectedEOF
		}
		return Message{}, err
	}
	return Decode(line)
}

// Writer writes whole messages to a stream; safe for concurrent use.
type Writer struct {
	mu sync.Mutex
	w  io.Writer
}

// NewWriter returns a Writer over w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// Write encodes m and writes it as one line in one write.
func (w *Writer) Write(m Message) error {
	b, err := Encode(m)
	if err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, err := w.w.Write(b); err != nil {
		return fmt.Errorf("writing %s message: %w", m.Type, err)
	}
	return nil
}
