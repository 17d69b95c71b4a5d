package main

import (
	"io"
	"os"
)

// streams are the standard streams a command reads and writes; tests inject buffers.
type streams struct {
	In     io.Reader
	Out    io.Writer
	ErrOut io.Writer
}

func stdStreams() streams { return streams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr} }
