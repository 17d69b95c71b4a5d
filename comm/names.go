package comm

import "fmt"

var dtypeNames = [...]string{"float32", "float16", "bfloat16", "float64", "int32", "int64", "uint8"}

// String names the type ("float32", "bfloat16", ...).
func (d DType) String() string {
	if d >= 0 && int(d) < len(dtypeNames) {
		return dtypeNames[d]
	}
	return fmt.Sprintf("DType(%d)", int(d))
}

var opNames = [...]string{"sum", "avg", "min", "max"}

// String names the operator ("sum", "avg", "min", "max").
func (o Op) String() string {
	if o >= 0 && int(o) < len(opNames) {
		return opNames[o]
	}
	return fmt.Sprintf("Op(%d)", int(o))
}
