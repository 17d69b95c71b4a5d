// Package printer renders command results as a table, JSON or YAML, the one
// output switch (-o table|json|yaml) that every migctl command shares.
//
// A command builds a value that knows how to print itself as a table (the
// Tabler interface) and hands it to Print with the user's format; JSON and YAML
// come from the value's exported fields and struct tags. Print renders first and
// writes the result with one Write, or nothing when rendering fails.
package printer
