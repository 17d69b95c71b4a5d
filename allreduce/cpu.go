package allreduce

import "runtime"

func numCPU() int { return runtime.NumCPU() }
