package main

import (
	"fmt"
	"os"
)

func main() {
	cmd := newRootCmd(stdStreams())
	if err := cmd.Execute(); err != nil {
		fmt.Fprintf(os.Stderr, "migctl: %v\n", err)
		os.Exit(1)
	}
}
